"""The index the broker matches a request against: the rules of one list
(allow or deny) arranged so that a look-up costs the same for 10 rules as
for 10,000 (docs/architecture.md "How a decision is made").

Matching never scans the rule list for names: exact names are a dict, and a
wildcard is found by walking the suffixes of the requested name in another
dict. Address rules are bucketed by prefix length. Nothing here parses an
address: a run without --policy builds two empty indexes.
"""
from __future__ import annotations


class RuleIndex:
    """Rules of one list (allow or deny), indexed so that a look-up costs the
    same for 10 rules as for 10,000."""

    __slots__ = ("exact", "wildcard", "networks", "prefixlens", "has_address_rules", "_address_ports",
                 "_address_any_port")

    def __init__(self, rules: tuple[Rule, ...]):
        self.exact: dict[str, list[Rule]] = {}
        self.wildcard: dict[str, list[Rule]] = {}
        # (version, prefixlen) -> {network address as int: rules}
        self.networks: dict[tuple[int, int], dict[int, list[Rule]]] = {}
        for rule in rules:
            if rule.kind == "name":
                self.exact.setdefault(rule.host, []).append(rule)
            elif rule.kind == "wildcard":
                self.wildcard.setdefault(rule.host, []).append(rule)
            else:
                net = rule.network
                bucket = self.networks.setdefault((net.version, net.prefixlen), {})
                bucket.setdefault(int(net.network_address), []).append(rule)
        self.prefixlens = {4: [], 6: []}
        for version, prefixlen in sorted(self.networks, key=lambda k: -k[1]):
            self.prefixlens[version].append(prefixlen)
        self.has_address_rules = bool(self.networks)
        address_ports = {r.port for r in rules if r.is_address}
        self._address_any_port = None in address_ports
        self._address_ports = frozenset(address_ports - {None})

    @staticmethod
    def _first(rules: list[Rule] | None, port: int) -> Rule | None:
        if rules:
            for rule in rules:
                if rule.port is None or rule.port == port:
                    return rule
        return None

    def match_name(self, name: str, port: int) -> Rule | None:
        rule = self._first(self.exact.get(name), port)
        if rule is not None or not self.wildcard:
            return rule
        # "*.b.c" matches "a.b.c" and "x.a.b.c", never "b.c": walk the
        # suffixes that are strictly shorter than the name.
        dot = name.find(".")
        while dot != -1:
            suffix = name[dot + 1:]
            rule = self._first(self.wildcard.get(suffix), port)
            if rule is not None:
                return rule
            dot = name.find(".", dot + 1)
        return None

    def match_address(self, ip: IPv4Address | IPv6Address, port: int) -> Rule | None:
        if not self.networks:
            return None
        value, bits = int(ip), ip.max_prefixlen
        for prefixlen in self.prefixlens[ip.version]:
            masked = value >> (bits - prefixlen) << (bits - prefixlen) if prefixlen else 0
            rule = self._first(self.networks[(ip.version, prefixlen)].get(masked), port)
            if rule is not None:
                return rule
        return None

    def address_rules_for_port(self, port: int) -> bool:
        return self._address_any_port or port in self._address_ports


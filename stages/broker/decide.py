"""The decision: five steps, in order, the first that decides wins.

1. deny rules on the name;
2. deny rules on every address the name resolved to;
3. deny_private on every address;
4. allow rules;
5. the default (deny when there is an allow list).

Pure: a target, a policy and (once looked up) addresses in; a `Decision` or a
`LookUp` out. The broker calls `decide(target, policy)` first. When the answer
is `LookUp()`, it resolves the name once and calls again with the addresses;
an allowed `Decision.addresses` is then exactly what it may dial (no second
look-up, so a DNS answer cannot change between the check and the dial).

`LookUp` is asked for only when an address could change the answer: the
policy has address deny rules or deny_private, which could refuse a name that
would otherwise be allowed. A denied name is never looked up, and under a
default of deny neither is a name that no allow rule matches by name: a DNS
query carries data out too. Address allow rules (`140.82.112.0/20`) apply to
address literals only; they never make vpnw look a name up to see whether
its addresses would match.

deny_private also works by name: before any look-up, names that stay on this
machine or inside a private network (`classify_name`: localhost, .local,
.internal, single-label names, cloud metadata names...) are refused.

IPv4 inside IPv6: an IPv4-mapped address (`::ffff:a.b.c.d`) is the IPv4 host
itself (it is how a dual-stack socket writes it), so every IPv4 rule applies
to it. A NAT64 address (`64:ff9b::a.b.c.d`, RFC 6052, and the local-use
64:ff9b:1::/48, RFC 8215) reaches that IPv4 host only on a network with a
NAT64 gateway for that prefix; vpnw does not know whether it is on one, so it
takes the safe side of each list: IPv4 deny rules and deny_private apply to
the NAT64 form, IPv4 allow rules do not (allow it with an IPv6 rule).

An allowed `Decision` with `addresses == ()` means no address was needed to
decide: the broker (or the exit proxy) resolves the name to dial it, and any
of its addresses is acceptable to the policy.
"""
from __future__ import annotations

from functools import lru_cache
from ipaddress import IPv4Address, IPv6Address, ip_address

from stages.config.records import NamedTuple   # not dataclasses: the loop's import (records.py)
from stages.config.addresses import (
    SPECIAL_LAST_LABELS, BadHost, classify, classify_name, embedded_ipv4, parse_host,
)
from stages.config.policy import Policy, Rule, check_policy_for_path  # noqa: F401  (re-exported for the broker)


class BadTarget(Exception):
    """A request we refuse before any decision; str() is the reason sentence."""


class Target(NamedTuple):
    host: str                              # canonical name, or the address as text
    port: int
    ip: IPv4Address | IPv6Address | None   # set when the client asked for an address

    def __str__(self) -> str:
        if isinstance(self.ip, IPv6Address):
            return f"[{self.ip}]:{self.port}"
        return f"{self.host}:{self.port}"


class LookUp:
    """Resolve the target's name, then call decide() again with its addresses.
    Every LookUp() is equal to every other (a field-less frozen dataclass, made
    by hand: see the namedtuples here)."""
    __slots__ = ()

    def __eq__(self, other) -> bool:
        return type(other) is LookUp

    def __hash__(self) -> int:
        return hash(LookUp)

    def __repr__(self) -> str:
        return "LookUp()"


class Decision(NamedTuple):
    allowed: bool
    reason: str           # a sentence for a person
    rule: str             # deny_private | default | deny "<text>" (line N) | allow "<text>" (line N) | no policy | target
    addresses: tuple = ()  # the addresses checked: the only ones the broker may dial (allowed, or --dry-run)


@lru_cache(maxsize=4096, typed=True)
def parse_target(host: str, port: int) -> Target:
    """What a client asked for -> Target, or BadTarget (odd spellings refused
    before anything is looked up). Pure, and a Target is immutable: the
    answers for the hosts a run asks for again and again are kept (a
    refusal is not kept, it is worked out again)."""
    if type(port) is not int or not 1 <= port <= 65535:
        raise BadTarget(f"{port!r} is not a port (1 to 65535)")
    try:
        canonical = parse_host(host)
    except BadHost as exc:
        raise BadTarget(str(exc)) from None
    if isinstance(canonical, str):
        return Target(host=canonical, port=port, ip=None)
    return Target(host=str(canonical), port=port, ip=canonical)


def _as_address(value) -> IPv4Address | IPv6Address:
    if isinstance(value, IPv6Address) and value.scope_id:
        return IPv6Address(int(value))
    if isinstance(value, (IPv4Address, IPv6Address)):
        return value
    return _as_address(ip_address(value))


def _match_address(index, ip, port: int, *, through_nat64: bool) -> Rule | None:
    # An IPv4-mapped address is the IPv4 host itself: rules written for that
    # IPv4 address apply. A NAT64 one only where asked (deny rules): see above.
    rule = index.match_address(ip, port)
    if rule is None and isinstance(ip, IPv6Address):
        embedded = embedded_ipv4(ip)
        if embedded is not None and (through_nat64 or int(ip) >> 32 == 0xFFFF):
            rule = index.match_address(embedded[0], port)
    return rule


def _deny(reason: str, rule: str, addresses: tuple = ()) -> Decision:
    # A denial still carries the addresses that were checked: under --dry-run
    # the broker goes on and must dial those, not look the name up again.
    return Decision(allowed=False, reason=reason, rule=rule, addresses=addresses)


def _deny_private(why: str, target: Target, policy: Policy, addresses: tuple = ()) -> Decision:
    """A refusal by deny_private names the setting, and the allow rule it
    overrides when one matches (deny_private comes first, step 3 before 4):
    an explicit allow is never overridden silently."""
    if target.ip is None:
        rule = policy.allow_index.match_name(target.host, target.port)
    else:
        rule = _match_address(policy.allow_index, target.ip, target.port, through_nat64=False)
    reason = f"{why}; refused by deny_private = true (set in {policy.source or 'the policy'})"
    if rule is not None:
        reason += (f', which comes before allow rule "{rule.text}" ({policy.where(rule)}): '
                   "set deny_private = false to allow it")
    return _deny(reason, "deny_private", addresses)


def _default(target: Target, policy: Policy, addresses: tuple) -> Decision:
    why = ("set in the policy" if policy.default_explicit else
           "because the policy has an allow list" if policy.has_allow_list else
           "because the policy has no allow list")
    if policy.default == "deny":
        return _deny(f"no allow rule matches {target}; default is deny ({why})", "default", addresses)
    return Decision(True, f"no rule matches {target}; default is allow ({why})", "default", addresses)


def decide(target: Target, policy: Policy, addresses=None, *,
           local_addresses=frozenset(), resolves_at_exit: bool = False) -> Decision | LookUp:
    """The five steps. `addresses`: None before a look-up, else every address
    the name resolved to. IP-literal targets never need a look-up."""
    if policy.no_policy:
        return Decision(True, "no policy: every connection is allowed", "no policy",
                        (target.ip,) if target.ip is not None else tuple(
                            _as_address(a) for a in addresses or ()))
    port = target.port
    is_name = target.ip is None

    # 1. deny rules on the name
    if is_name:
        rule = policy.deny_index.match_name(target.host, port)
        if rule is not None:
            return _deny(f'{target} matches deny rule "{rule.text}" ({policy.where(rule)})',
                         f"deny {rule.label()}")
        # 3, by name: deny_private refuses names that stay on this machine or
        # in a private network before they are looked up.
        if policy.deny_private:
            host = target.host
            dot = host.rfind(".")
            # Inline fast path: most names end in a label no special name has.
            if dot == -1 or host[dot + 1:] in SPECIAL_LAST_LABELS:
                why = classify_name(host)
                if why is not None:
                    return _deny_private(f"{host}: {why}", target, policy)

    if not is_name:
        addresses = (target.ip,)
    elif resolves_at_exit:
        # The exit resolves the name; vpnw never sees its addresses. The CLI
        # has already refused policies that would need them (check_policy_for_path).
        addresses = None
    elif addresses is None:
        if _address_could_change_answer(target, policy):
            return LookUp()
    if addresses is not None:
        seen = dict.fromkeys(_as_address(a) for a in addresses)
        addresses = tuple(seen)
        if not addresses:
            return _deny(f"{target.host} resolved to no address", "target")
        # A frozenset is taken as it is: the broker makes one per run, of
        # address objects without scope ids (local_addresses.py). Any other
        # iterable is normalised here, at the cost of a set per decision.
        local = local_addresses if type(local_addresses) is frozenset else frozenset(
            _as_address(a) for a in local_addresses)

        # 2. deny rules on every address
        for ip in addresses:
            rule = _match_address(policy.deny_index, ip, port, through_nat64=True)
            if rule is not None:
                subject = f"{target} resolved to {ip}, which" if is_name else f"{target}"
                return _deny(f'{subject} matches deny rule "{rule.text}" ({policy.where(rule)})',
                             f"deny {rule.label()}", addresses)
        # 3. deny_private on every address
        if policy.deny_private:
            for ip in addresses:
                why = classify(ip, local)
                if why is not None:
                    return _deny_private(f"{target.host} resolved to {why}" if is_name else why,
                                         target, policy, addresses)
    else:
        addresses = ()

    # 4. allow rules: the name matches one, or every address matches one
    if is_name:
        rule = policy.allow_index.match_name(target.host, port)
        if rule is not None:
            return Decision(True, f'{target} matches allow rule "{rule.text}" ({policy.where(rule)})',
                            f"allow {rule.label()}", addresses)
    elif policy.allow_index.has_address_rules:
        # Address allow rules apply to address literals only (see above).
        rule = _match_address(policy.allow_index, target.ip, port, through_nat64=False)
        if rule is not None:
            return Decision(True, f'{target} matches allow rule "{rule.text}" ({policy.where(rule)})',
                            f"allow {rule.label()}", addresses)

    # 5. the default
    return _default(target, policy, addresses)


def addresses_matter(target: Target, policy: Policy) -> bool:
    """Whether an address of this name could refuse it (deny rules on
    addresses, deny_private): what a name the person allowed (--ask) must
    still be checked against once looked up."""
    return bool(policy.deny_private or policy.deny_index.address_rules_for_port(target.port))


def _address_could_change_answer(target: Target, policy: Policy) -> bool:
    """Step 1 has passed. Would any address move the decision for this name?
    Only a refusal can: address allow rules never apply to names."""
    port = target.port
    if policy.default == "deny" and policy.allow_index.match_name(target.host, port) is None:
        return False         # nothing can allow it: never look it up
    return policy.deny_private or policy.deny_index.address_rules_for_port(port)

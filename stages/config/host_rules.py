"""The rule grammar of a policy's allow and deny lists: one pattern as
written -> a `Rule`, or `BadRule(problem, fix)` for the policy's message.

Rules are host patterns with an optional port: an exact name, `*.suffix`
(any name below suffix, never suffix itself), an IP address or a CIDR block;
`:PORT` after any of them, with IPv6 in brackets (`[2001:db8::1]:443`).
Names are stored in the canonical form of `addresses.parse_host`.

Loaded with the first rule parsed (stages/config/policy.py imports it
there): a run without --policy needs neither this nor ipaddress before its
stages start (docs/architecture.md "Start-up budget").
"""
from __future__ import annotations

import re
from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_network

from stages.config.addresses import BadHost, parse_host
from stages.startup.records import NamedTuple   # not typing's (docs/architecture.md "Start-up budget")


class Rule(NamedTuple):
    """One allow or deny rule as parsed."""
    text: str                      # as written in the file
    kind: str                      # 'name' | 'wildcard' | 'ip' | 'cidr'
    port: int | None
    line: int | None
    host: str | None = None        # 'name': the name; 'wildcard': the suffix after "*."
    network: IPv4Network | IPv6Network | None = None   # 'ip' (/32, /128) and 'cidr'

    @property
    def is_address(self) -> bool:
        return self.kind in ("ip", "cidr")

    def label(self) -> str:
        """How Decision.rule names this rule: deny "x" (line N)."""
        where = f" (line {self.line})" if self.line else ""
        return f'"{self.text}"{where}'


class BadRule(ValueError):
    """A pattern that is not a rule: what is wrong with it and how to write it."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


_PORT = r"[1-9][0-9]{0,4}"


def _parse_port(text: str, pattern: str) -> int:
    if not re.fullmatch(_PORT, text) or int(text) > 65535:
        raise BadRule(f'"{text}" is not a port',
                      "write a port from 1 to 65535 after the colon, or leave the port out")
    return int(text)


_EVERY_NAME_FIX = {
    "allow": 'to allow every name, leave the allow list out and set default = "allow"',
    "deny": 'to deny everything not allowed, set default = "deny" and list what is allowed in allow',
}


def _normalised(network: IPv4Network | IPv6Network) -> IPv4Network | IPv6Network:
    """A rule inside the IPv4-mapped range is the IPv4 rule it spells:
    deny "::ffff:203.0.113.66" denies 203.0.113.66, as a request for
    ::ffff:203.0.113.66 is judged as 203.0.113.66."""
    if network.version == 6 and network.subnet_of(IPv6Network("::ffff:0:0/96")):
        return IPv4Network((int(network.network_address) & 0xFFFFFFFF, network.prefixlen - 96))
    return network


def _looks_like_url(text: str) -> bool:
    return "://" in text or (text.count("/") > 1 and not text.startswith("["))


def _ambiguous_ipv6(host: str) -> bool:
    """"2001:db8::1:443" reads both as an address and as 2001:db8::1 with
    port 443: a person who meant the port would get a different rule."""
    head, _, last = host.rpartition(":")
    if not head or not re.fullmatch(_PORT, last) or int(last) > 65535:
        return False
    try:
        IPv6Address(head)
    except ValueError:
        return False
    return True


def parse_rule(text: str, line: int | None = None, which: str = "allow") -> Rule:
    """One pattern -> Rule, or BadRule(problem, fix): the whole pattern's
    form first, then its host and port apart, then the host by its kind."""
    _check_form(text)
    host, port = _host_and_port(text)
    if host == "*":
        raise BadRule('"*" alone would match every name', _EVERY_NAME_FIX[which])
    if "*" in host:
        return _wildcard_rule(text, host, port, line)
    if "/" in host:
        return _cidr_rule(text, host, port, line)
    try:
        canonical = parse_host(host)
    except BadHost as exc:
        raise BadRule(str(exc), "write a host name such as api.github.com, an IP address, "
                      'or "*.example.com"') from None
    if isinstance(canonical, str):
        return Rule(text=text, kind="name", port=port, line=line, host=canonical)
    return Rule(text=text, kind="ip", port=port, line=line, network=_normalised(ip_network(canonical)))


def _check_form(text: str) -> None:
    """What no pattern may be, whatever its host: empty, spaced, a URL, not ASCII."""
    if text == "":
        raise BadRule("the pattern is empty", "remove it, or write a host name")
    if text != text.strip() or any(c.isspace() for c in text):
        raise BadRule("the pattern holds spaces", "write the host without spaces")
    if _looks_like_url(text):
        raise BadRule("this is a URL, not a host pattern",
                      'write only the host, with a port if needed: "api.github.com" or '
                      '"api.github.com:443"')
    if not text.isascii():
        raise BadRule("the pattern holds characters that are not ASCII; vpnw refuses such names "
                      "in requests, so a rule for one could never match",
                      _a_label_fix(text))


def _host_and_port(text: str) -> tuple[str, int | None]:
    """The host as written and the port (None: any), IPv6 in brackets."""
    port: int | None = None
    host = text
    if text.startswith("["):
        end = text.find("]")
        if end == -1:
            raise BadRule("an opening [ without ]", "write an IPv6 address as [2001:db8::1]:443")
        host, rest = text[1:end], text[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise BadRule(f'unexpected "{rest}" after ]', "write [2001:db8::1]:443")
            port = _parse_port(rest[1:], text)
        if ":" not in host:
            raise BadRule("brackets are only for IPv6 addresses", "write the host without brackets")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
        port = _parse_port(port_text, text)
        if host == "":
            raise BadRule("a port without a host", "write the host before the colon")
    elif ":" in text and _ambiguous_ipv6(text.partition("/")[0]):
        address, _, last = text.partition("/")[0].rpartition(":")
        raise BadRule("an IPv6 address with a port must be in brackets; without them this reads "
                      f"both as one address and as {address} with port {last}",
                      f'write "[{address}]:{last}" for the port, or "[{text}]" for the address')
    return host, port


def _wildcard_rule(text: str, host: str, port: int | None, line: int | None) -> Rule:
    if not host.startswith("*.") or "*" in host[2:]:
        raise BadRule('a wildcard may only be "*." at the start',
                      'write "*.example.com" to match every name below example.com')
    suffix = host[2:]
    try:
        canonical = parse_host(suffix)
    except BadHost as exc:
        raise BadRule(str(exc), 'write "*." followed by a host name') from None
    if not isinstance(canonical, str):
        raise BadRule("a wildcard is for names, not addresses",
                      "write an address or a CIDR block (10.0.0.0/8) without the *.")
    return Rule(text=text, kind="wildcard", port=port, line=line, host=canonical)


def _cidr_rule(text: str, host: str, port: int | None, line: int | None) -> Rule:
    addr, _, bits = host.partition("/")
    try:
        parse_ip = parse_host(addr)
    except BadHost as exc:
        raise BadRule(str(exc), "write a CIDR block as 140.82.112.0/20 or 2001:db8::/32") from None
    if isinstance(parse_ip, str) or not re.fullmatch(r"[0-9]{1,3}", bits):
        raise BadRule("not a CIDR block", "write a CIDR block as 140.82.112.0/20 or 2001:db8::/32")
    try:
        network = ip_network(f"{parse_ip}/{int(bits)}", strict=False)
    except ValueError:
        raise BadRule(f"/{bits} is not a prefix length for this address",
                      "use /0 to /32 for IPv4 and /0 to /128 for IPv6") from None
    if network.network_address != parse_ip:
        raise BadRule("the address has bits set beyond the prefix length",
                      f'write "{network}" (the block that contains it)')
    return Rule(text=text, kind="cidr", port=port, line=line, network=_normalised(network))


def _a_label_fix(text: str) -> str:
    host = text.split(":", 1)[0] if text.count(":") == 1 else text
    prefix = "*." if host.startswith("*.") else ""
    try:
        import idna   # only for this hint: the A-label clients send (IDNA 2008, UTS 46)
        a_label = idna.encode(host[len(prefix):], uts46=True).decode("ascii")
    except Exception:  # noqa: BLE001 - no hint is better than a wrong one
        return "write the name in its A-label form (xn--...), as clients send it"
    return f'write "{prefix}{a_label}" (its A-label, as clients send it)'

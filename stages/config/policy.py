"""The policy file -> a frozen `Policy`, or a `PolicyError` that names the file,
the line and the fix.

    version = 1
    name = "agent"

    [policy]
    default = "deny"          # "allow" | "deny"; absent: deny when there is an allow list
    deny_private = true       # absent: false
    allow = ["api.github.com", "*.pythonhosted.org", "140.82.112.0/20", "[2001:db8::1]:443"]
    deny = ["*.example"]

Choices this module makes (the description leaves them open):
- `deny_private` is false unless the file sets it. The description's example
  writes `deny_private = true` explicitly, and learn's drafts do the same.
- "there is an allow list" means the `allow` key is present, even when empty:
  `allow = []` with no default denies everything.
- `name` may be left out; it then defaults to the file's name without `.toml`.

Rules are host patterns with an optional port: an exact name, `*.suffix`
(any name below suffix, never suffix itself), an IP address or a CIDR block;
`:PORT` after any of them, with IPv6 in brackets (`[2001:db8::1]:443`).
Names are stored in the canonical form of `addresses.parse_host`.

Matching never scans the rule list for names: exact names are a dict, and a
wildcard is found by walking the suffixes of the requested name in another
dict. Address rules are bucketed by prefix length.

tomllib reports no line numbers for values; stages/config/toml_lines.py finds the
line of each key and array item, for the paths config as well.
"""
from __future__ import annotations

import os
import re

# ipaddress and stages.config.addresses are imported where rules are parsed:
# a run without --policy (Policy.allow_all) needs neither before its
# stages start (docs/architecture.md "Start-up budget").
from stages.startup.records import FrozenRecord, NamedTuple   # not dataclasses, not typing

VERSION = 1
TOP_KEYS = ("version", "name", "policy", "files", "unix", "secrets")
UNIX_KEYS = ("allow",)
# Patterns as text, compiled (and cached by re) on first use: a run whose
# policy has no such entry never compiles them (vpnw's start, before the
# recorder's fork; docs/architecture.md, "Start-up budget").
_ENV_NAME = r"\$[A-Za-z_][A-Za-z0-9_]*"
POLICY_KEYS = ("default", "deny_private", "allow", "deny", "ask", "capture")
MAX_PROBLEMS = 20


class PolicyError(Exception):
    """A policy that cannot be used. str() is the whole message for the user,
    one `file:line: problem; fix: ...` sentence a line."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None):
        super().__init__(message)
        self.source = source
        self.line = line


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


class RuleIndex:
    """Rules of one list (allow or deny), indexed so that a look-up costs the
    same for 10 rules as for 10,000."""

    __slots__ = ("exact", "wildcard", "networks", "prefixlens", "has_address_rules", "has_name_rules",
                 "_address_ports", "_address_any_port")

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
        self.has_name_rules = bool(self.exact or self.wildcard)

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


class Policy(FrozenRecord):
    """A policy file, parsed and checked."""
    _uncompared = ("sha256", "deny_private_line", "allow_index", "deny_index")
    _unshown = ("allow_index", "deny_index")
    name: str
    default: str                   # "allow" | "deny"
    default_explicit: bool         # False: the default came from the presence of an allow list
    deny_private: bool
    allow: tuple[Rule, ...]
    deny: tuple[Rule, ...]
    source: str | None             # the file as the user named it; None for allow_all()
    has_allow_list: bool = False
    no_policy: bool = False        # allow_all(): run/trace without --policy
    files: "FileRules | None" = None   # the [files] table; None when the policy has none
    ask: bool = False              # `ask = true`: guard asks the person (as with --ask)
    sha256: str | None = None      # of the text read (--ask writes back only onto it)
    capture: bool = False          # capture = true: every run under it captures (docs/architecture.md "Capture")
    unix_allow: tuple[str, ...] = ()   # [unix] allow: paths and $VARIABLES, as written
    secrets: tuple = ()            # [secrets.NAME] tables (stages/config/secrets.py's Secret)
    deny_private_line: int | None = None   # where it is set
    allow_index: RuleIndex = None  # made from allow by __post_init__
    deny_index: RuleIndex = None

    def __post_init__(self):
        if self.allow_index is None:
            object.__setattr__(self, "allow_index", RuleIndex(self.allow))
        if self.deny_index is None:
            object.__setattr__(self, "deny_index", RuleIndex(self.deny))

    @staticmethod
    def allow_all() -> "Policy":
        """No --policy: everything is allowed and decide() never asks for a look-up."""
        return Policy(name="", default="allow", default_explicit=False, deny_private=False,
                      allow=(), deny=(), source=None, no_policy=True)

    def where(self, rule: Rule) -> str:
        """`agent.toml line 9` for reasons."""
        src = self.source or "policy"
        return f"{src} line {rule.line}" if rule.line else src


def localhost_ports(policy: Policy) -> tuple[int, ...]:
    """The machine's own services the policy opens (docs/architecture.md "The
    machine's own loopback"): the ports of allow rules written exactly
    `localhost:PORT`. Each becomes a door on the sandbox's loopback."""
    return tuple(sorted({r.port for r in policy.allow
                         if r.kind == "name" and r.host == "localhost" and r.port}))


def localhost_rule(policy: Policy, port: int) -> Rule | None:
    """The allow rule `localhost:PORT` for this port, unless a deny rule on
    localhost takes it back."""
    if policy.deny_index.match_name("localhost", port) is not None:
        return None
    return next((r for r in policy.allow if r.kind == "name" and r.host == "localhost"
                 and r.port == port), None)


def needs_addresses(policy: Policy) -> bool:
    """Whether any rule of the policy depends on the addresses a name resolves
    to (deny_private, or a deny rule written as an address or CIDR). Address
    allow rules apply to address literals only, so they never do."""
    if policy.no_policy:
        return False
    return policy.deny_private or policy.deny_index.has_address_rules


def check_policy_for_path(policy: Policy, resolves_at_exit: bool) -> str | None:
    """None when the policy can be honoured on a path; else why not, as a
    sentence with the fix.

    On a path that resolves names at the exit (socks5h://, http:// proxies)
    vpnw never sees the addresses of a name, so it refuses every rule that
    could only work on them rather than enforce it partly: deny_private with a
    default of allow, and address deny rules (which would catch a literal but
    never a name that resolves into the range). Address allow rules stay: they
    apply to address literals on every path. deny_private with a default of
    deny stays too, and the run says once at its start what it covers there
    (`deny_private_scope`).
    """
    if not resolves_at_exit or policy.no_policy:
        return None
    if policy.deny_private and policy.default == "allow":
        return ("deny_private with a default of allow needs the addresses names resolve to, "
                "but this path resolves names at the exit, where vpnw cannot see them; "
                'fix: set default = "deny" with an allow list, or use a path that resolves '
                "names here (socks5://)")
    for rule in policy.deny:
        if rule.is_address:
            return (f'deny rule "{rule.text}" (line {rule.line}) is an address rule, but this path '
                    "resolves names at the exit, where vpnw cannot see the addresses names resolve "
                    "to, so it would stop only requests written as addresses; fix: deny by name, "
                    "or use a path that resolves names here (socks5://)")
    return None


def deny_private_scope(policy: Policy, resolves_at_exit: bool) -> str | None:
    """What deny_private covers on this run's path, for run.start: None
    without deny_private; "addresses" when vpnw sees every address it
    dials; "literals-and-names" on a path that resolves names at the exit,
    where it covers address literals and special names only."""
    from stages.record.events import DENY_PRIVATE_SCOPES
    if policy.no_policy or not policy.deny_private:
        return None
    return DENY_PRIVATE_SCOPES[1] if resolves_at_exit else DENY_PRIVATE_SCOPES[0]


SHADOWS_BUDGET = 300     # characters of run.start the shadowed rules may take (a line is 4,000)


def deny_private_shadows(policy: Policy) -> dict:
    """run.start's deny_private_shadows: the allow rules that deny_private =
    true refuses whatever they say, because it comes first (a name that by
    definition stays private, an address or range that starts in a special
    one), and where it is set; {} when none. Said once at the start so an
    allow rule is never overridden silently. `localhost:PORT` is not among
    them: it opens the machine's loopback at its own door. A name that only
    resolves to a private address is named at its denial, as no look-up is
    made before the run (docs/architecture.md "How a decision is made")."""
    if policy.no_policy or not policy.deny_private:
        return {}
    from stages.config.addresses import classify, classify_name
    rules, room, unlisted = [], SHADOWS_BUDGET, 0
    for rule in policy.allow:
        if rule.kind == "name":
            hit = classify_name(rule.host) is not None and not (rule.host == "localhost" and rule.port)
        elif rule.kind == "wildcard":
            hit = classify_name(f"x.{rule.host}") is not None
        else:
            hit = classify(rule.network.network_address) is not None
        if not hit:
            continue
        label = rule.label()
        if len(label) + 4 > room:
            unlisted += 1
            continue
        rules.append(label)
        room -= len(label) + 4
    if not rules and not unlisted:
        return {}
    where = policy.source or "the policy"
    record = {"set": f"{where} line {policy.deny_private_line}" if policy.deny_private_line else where,
              "rules": rules}
    return {"deny_private_shadows": {**record, **({"unlisted": unlisted} if unlisted else {})}}


# --- rule patterns -----------------------------------------------------------

class _BadRule(ValueError):
    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


_PORT = r"[1-9][0-9]{0,4}"


def _parse_port(text: str, pattern: str) -> int:
    if not re.fullmatch(_PORT, text) or int(text) > 65535:
        raise _BadRule(f'"{text}" is not a port',
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
    from ipaddress import IPv4Network, IPv6Network
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
    from ipaddress import IPv6Address
    try:
        IPv6Address(head)
    except ValueError:
        return False
    return True


def parse_rule(text: str, line: int | None = None, which: str = "allow") -> Rule:
    """One pattern -> Rule, or _BadRule(problem, fix)."""
    from ipaddress import ip_network
    from stages.config.addresses import BadHost, parse_host
    if text == "":
        raise _BadRule("the pattern is empty", "remove it, or write a host name")
    if text != text.strip() or any(c.isspace() for c in text):
        raise _BadRule("the pattern holds spaces", "write the host without spaces")
    if _looks_like_url(text):
        raise _BadRule("this is a URL, not a host pattern",
                       'write only the host, with a port if needed: "api.github.com" or '
                       '"api.github.com:443"')
    if not text.isascii():
        raise _BadRule("the pattern holds characters that are not ASCII; vpnw refuses such names "
                       "in requests, so a rule for one could never match",
                       _a_label_fix(text))
    port: int | None = None
    host = text
    if text.startswith("["):
        end = text.find("]")
        if end == -1:
            raise _BadRule("an opening [ without ]", "write an IPv6 address as [2001:db8::1]:443")
        host, rest = text[1:end], text[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise _BadRule(f'unexpected "{rest}" after ]', "write [2001:db8::1]:443")
            port = _parse_port(rest[1:], text)
        if ":" not in host:
            raise _BadRule("brackets are only for IPv6 addresses", "write the host without brackets")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
        port = _parse_port(port_text, text)
        if host == "":
            raise _BadRule("a port without a host", "write the host before the colon")
    elif ":" in text and _ambiguous_ipv6(text.partition("/")[0]):
        address, _, last = text.partition("/")[0].rpartition(":")
        raise _BadRule("an IPv6 address with a port must be in brackets; without them this reads "
                       f"both as one address and as {address} with port {last}",
                       f'write "[{address}]:{last}" for the port, or "[{text}]" for the address')

    if host == "*":
        raise _BadRule('"*" alone would match every name', _EVERY_NAME_FIX[which])
    if "*" in host:
        if not host.startswith("*.") or "*" in host[2:]:
            raise _BadRule('a wildcard may only be "*." at the start',
                           'write "*.example.com" to match every name below example.com')
        suffix = host[2:]
        try:
            canonical = parse_host(suffix)
        except BadHost as exc:
            raise _BadRule(str(exc), 'write "*." followed by a host name') from None
        if not isinstance(canonical, str):
            raise _BadRule("a wildcard is for names, not addresses",
                           "write an address or a CIDR block (10.0.0.0/8) without the *.")
        return Rule(text=text, kind="wildcard", port=port, line=line, host=canonical)
    if "/" in host:
        addr, _, bits = host.partition("/")
        try:
            parse_ip = parse_host(addr)
        except BadHost as exc:
            raise _BadRule(str(exc), "write a CIDR block as 140.82.112.0/20 or 2001:db8::/32") from None
        if isinstance(parse_ip, str) or not re.fullmatch(r"[0-9]{1,3}", bits):
            raise _BadRule("not a CIDR block", "write a CIDR block as 140.82.112.0/20 or 2001:db8::/32")
        try:
            network = ip_network(f"{parse_ip}/{int(bits)}", strict=False)
        except ValueError:
            raise _BadRule(f"/{bits} is not a prefix length for this address",
                           "use /0 to /32 for IPv4 and /0 to /128 for IPv6") from None
        if network.network_address != parse_ip:
            raise _BadRule("the address has bits set beyond the prefix length",
                           f'write "{network}" (the block that contains it)')
        return Rule(text=text, kind="cidr", port=port, line=line, network=_normalised(network))
    try:
        canonical = parse_host(host)
    except BadHost as exc:
        raise _BadRule(str(exc), "write a host name such as api.github.com, an IP address, "
                       'or "*.example.com"') from None
    if isinstance(canonical, str):
        return Rule(text=text, kind="name", port=port, line=line, host=canonical)
    return Rule(text=text, kind="ip", port=port, line=line, network=_normalised(ip_network(canonical)))


def _a_label_fix(text: str) -> str:
    host = text.split(":", 1)[0] if text.count(":") == 1 else text
    prefix = "*." if host.startswith("*.") else ""
    try:
        import idna   # only for this hint: the A-label clients send (IDNA 2008, UTS 46)
        a_label = idna.encode(host[len(prefix):], uts46=True).decode("ascii")
    except Exception:  # noqa: BLE001 - no hint is better than a wrong one
        return "write the name in its A-label form (xn--...), as clients send it"
    return f'write "{prefix}{a_label}" (its A-label, as clients send it)'



# --- loading ------------------------------------------------------------------

def _show(value) -> str:
    # A value from the file goes into a one-line message: no line breaks or
    # control characters of its own (a "\r" once split a message in two).
    from stages.record.text import printable
    text = repr(value) if not isinstance(value, str) else '"' + printable(value) + '"'
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), "a date or time")


class _Problems:
    def __init__(self, source: str, lines: dict[tuple, int]):
        self.source = source
        self.lines = lines
        self.found: list[tuple[int, str]] = []

    def line_of(self, path: tuple) -> int:
        from stages.config.toml_lines import line_of
        return line_of(self.lines, path) or 1

    def add(self, path: tuple, what: str, fix: str) -> None:
        line = self.line_of(path)
        self.found.append((line, f"{self.source}:{line}: {what}; fix: {fix}"))

    def raise_if_any(self) -> None:
        if self.found:
            self.found.sort(key=lambda item: item[0])
            first = self.found[0][0]
            messages = [m for _, m in self.found[:MAX_PROBLEMS]]
            if len(self.found) > MAX_PROBLEMS:
                messages.append(f"{self.source}: ... and {len(self.found) - MAX_PROBLEMS} more problems")
            raise PolicyError("\n".join(messages), source=self.source, line=first)


def _unknown(key: str, known: tuple) -> str:
    import difflib    # only for a mistake: not on every run's start-up
    near = difflib.get_close_matches(key, known, n=1)
    if near:
        return f'did you mean "{near[0]}"?'
    return "the keys allowed here are " + ", ".join(known)


def _unclosed_array_line(text: str) -> int | None:
    """The line of the `key = [` whose array is still open at the end of the
    text: where a person has to look, rather than the end of the file."""
    opened_at, depth = None, 0
    for number, line in enumerate(text.splitlines(), 1):
        code = re.sub(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'', '""', line).split("#", 1)[0]
        for ch in code:
            if ch == "[" and depth == 0 and "=" in code.split("[", 1)[0]:
                opened_at = number
            if ch == "[" and (depth or "=" in code.split("[", 1)[0]):
                depth += 1
            elif ch == "]" and depth:
                depth -= 1
    return opened_at if depth else None


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Policy text -> Policy, or PolicyError naming source and line."""
    data = _toml(text, source)
    from stages.config.toml_lines import key_lines    # only a policy file needs it: not allow_all()
    problems = _Problems(source, key_lines(text))
    for key in data:
        if key not in TOP_KEYS:
            problems.add((key,), f'unknown key "{key}"', _unknown(key, TOP_KEYS))
    _check_version(data, problems)
    name = _name(data, source, problems)
    body = _policy_table(data, problems)
    default = body.get("default")
    if default is not None and default not in ("allow", "deny"):
        shown = _show(default) if isinstance(default, str) else _type_name(default)
        problems.add(("policy", "default"), f'default is {shown}, not "allow" or "deny"',
                     'write default = "deny" (or "allow")')
        default = None
    flags = {key: _flag(body, key, problems) for key in ("deny_private", "capture", "ask")}
    lists = {which: _rules(body, which, problems) for which in ("allow", "deny")}
    files = _parse_files(data, problems)
    unix_allow = _parse_unix(data, problems)
    secrets = _parse_secrets(data, problems)
    problems.raise_if_any()
    has_allow_list = "allow" in body
    explicit = default is not None
    if default is None:
        default = "deny" if has_allow_list else "allow"
    from stages.record.digests import sha256    # only with a policy file
    return Policy(name=name, default=default, default_explicit=explicit,
                  allow=lists["allow"], deny=lists["deny"], **flags,
                  deny_private_line=problems.line_of(("policy", "deny_private")) if flags["deny_private"]
                  else None,
                  source=source, has_allow_list=has_allow_list, files=files, unix_allow=unix_allow,
                  secrets=secrets, sha256=sha256(text.encode("utf-8", "surrogatepass")).hexdigest())


def _toml(text: str, source: str) -> dict:
    import tomllib    # only with a policy file: not on every run's start-up
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        where = f"{m.group(1)}:{m.group(2)}" if m else "1"
        problem = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", msg)
        if not m and "end of document" in msg:
            where = str(text.count("\n") + 1)
        opened = _unclosed_array_line(text) if "Unclosed array" in msg else None
        if opened:
            where = str(opened)
            problem += " (it opens here and never closes)"
        raise PolicyError(f"{source}:{where}: TOML syntax error: {problem}; fix: correct the "
                          "TOML at that place (strings need quotes, arrays need [ ])",
                          source=source, line=int(where.split(":")[0])) from None


def _check_version(data: dict, problems: _Problems) -> None:
    version = data.get("version")
    if "version" not in data:
        problems.add((), "the policy has no version", "add `version = 1` at the top")
    elif type(version) is not int:
        problems.add(("version",), f"version is {_type_name(version)}, not an integer",
                     "write `version = 1`")
    elif version != VERSION:
        problems.add(("version",), f"unknown policy version {version}; this vpnw reads version 1",
                     "write `version = 1`, or use the vpnw that wrote this policy")


def _name(data: dict, source: str, problems: _Problems) -> str:
    default_name = "stdin" if source == "<stdin>" else os.path.basename(source)
    if default_name.endswith(".toml"):
        default_name = default_name[:-5]
    name = data.get("name", default_name)
    if not isinstance(name, str):
        problems.add(("name",), f"name is {_type_name(name)}, not a string", 'write name = "agent"')
        return default_name
    if not name or len(name) > 200 or not name.isprintable():
        problems.add(("name",), "name must be 1 to 200 printable characters", 'write name = "agent"')
    return name


def _policy_table(data: dict, problems: _Problems) -> dict:
    body = data.get("policy")
    if "policy" not in data:
        problems.add((), "the policy has no [policy] table",
                     'add a [policy] table with default = "deny" and an allow list')
        return {}
    if not isinstance(body, dict):
        problems.add(("policy",), f"policy is {_type_name(body)}, not a table",
                     "write [policy] on a line of its own, with its keys below it")
        return {}
    for key in body:
        if key not in POLICY_KEYS:
            problems.add(("policy", key), f'unknown key "{key}" in [policy]', _unknown(key, POLICY_KEYS))
    return body


def _flag(body: dict, key: str, problems: _Problems) -> bool:
    """A true/false key of [policy] (false when absent or wrong)."""
    value = body.get(key, False)
    if type(value) is not bool:
        problems.add(("policy", key), f"{key} is {_type_name(value)}, not true or false",
                     f"write {key} = true (no quotes)")
        return False
    return value


def _rules(body: dict, which: str, problems: _Problems) -> tuple[Rule, ...]:
    rules = []
    for index, pattern, path in _string_list(
            problems, ("policy", which), body.get(which, []),
            f'write {which} = ["api.github.com", "*.pythonhosted.org"]',
            'write each pattern in quotes, as "api.github.com"') or ():
        try:
            rules.append(parse_rule(pattern, problems.line_of(path), which))
        except _BadRule as exc:
            problems.add(path, f"{which}[{index}] {_show(pattern)}: {exc.problem}", exc.fix)
    return tuple(rules)


def load_policy(path: str, *, stdin=None) -> Policy:
    """Read and parse a policy file ("-": stdin). Every problem, with the
    input or in it, is a PolicyError: `file[:line]: problem; fix: ...`."""
    from stages.config.inputs import InputProblem, read_text, source_name
    source = source_name(path)
    try:
        text = read_text(path, "policy", stdin=stdin)
    except InputProblem as exc:
        where = f"{source}:{exc.line}" if exc.line else source
        raise PolicyError(f"{where}: {exc.problem}; fix: {exc.fix}", source=source,
                          line=exc.line) from None
    return parse_policy(text, source=source)


# --- the [files] table (file limits) ------------------------------------------
#
#     [files]
#     deny_read = ["~/.ssh", "~/.aws", "~/.netrc"]   # hidden: empty, read-only
#     allow_write = [".", "/tmp"]                    # everything else is read-only
#     outside = "held"                               # ...or held (docs/security.md)
#
# Here only the words are checked (type, form). What a path means on this
# machine (~, ., symlinks, whether it exists) is decided once per run, before
# the program starts, by stages.config.file_limits.resolve.

FILES_KEYS = ("deny_read", "allow_write", "outside")
FILES_LISTS = ("deny_read", "allow_write")
# outside: what writes outside allow_write meet (stages/config/work_set.py).
FILES_OUTSIDE = ("read-only", "held")


class FileEntry(NamedTuple):
    """One path of the [files] table, as written."""
    text: str                      # as written: "~/.ssh", ".", "/tmp"
    line: int | None


class FileRules(NamedTuple):
    """The [files] table as written."""
    deny_read: tuple[FileEntry, ...] = ()
    allow_write: tuple[FileEntry, ...] | None = None   # None: no write limit (key absent)
    outside: str = "read-only"     # "held": writes outside allow_write go to the held layer


def check_file_entry(text: str) -> tuple[str, str] | None:
    """None when `text` is a path a [files] list can hold; else (problem, fix)."""
    if text == "":
        return "the path is empty", 'remove it, or write a path such as "~/.ssh"'
    if "\0" in text or not text.isprintable():
        return "the path holds control characters", "write the path in plain characters"
    if text.startswith("~") and not (text == "~" or text.startswith("~/")):
        return ("~user is not supported", "write ~/ for the invoking user's home, "
                "or the other user's home as an absolute path")
    if not (text.startswith(("/", "~")) or text == "." or text.startswith("./")
            or text == ".." or text.startswith("../")):
        return ("a path must be absolute or start with ~ or .",
                f'write "./{text}" (relative to where vpnw starts) or an absolute path')
    return None


def _string_list(problems, key: tuple, value, fix_list: str, fix_item: str):
    """The strings of a list setting (allow, deny, deny_read, allow_write), each
    with its index and key path for messages; None when it is not a list. An
    entry that is not a string is reported and skipped."""
    which = key[-1]
    if not isinstance(value, list):
        problems.add(key, f"{which} is {_type_name(value)}, not an array", fix_list)
        return None
    items = []
    for index, item in enumerate(value):
        path = (*key, index)
        if not isinstance(item, str):
            problems.add(path, f"{which}[{index}] is {_type_name(item)}, not a string", fix_item)
            continue
        items.append((index, item, path))
    return items


def _parse_unix(data: dict, problems: "_Problems") -> tuple[str, ...]:
    """[unix] allow: Unix sockets outside the sandbox the program may connect
    to, each an absolute path or $VARIABLE (resolved when a run starts:
    unix_sockets_named)."""
    if "unix" not in data:
        return ()
    body = data["unix"]
    if not isinstance(body, dict):
        problems.add(("unix",), f"unix is {_type_name(body)}, not a table",
                     'write [unix] on a line of its own, with allow = ["$SSH_AUTH_SOCK"] below it')
        return ()
    for key in body:
        if key not in UNIX_KEYS:
            problems.add(("unix", key), f'unknown key "{key}" in [unix]', _unknown(key, UNIX_KEYS))
    entries = []
    for index, text, path in _string_list(
            problems, ("unix", "allow"), body.get("allow", []),
            'write allow = ["$SSH_AUTH_SOCK", "/run/postgresql/.s.PGSQL.5432"]',
            'write each socket in quotes, as "$SSH_AUTH_SOCK"') or ():
        if not (text.startswith("/") or re.fullmatch(_ENV_NAME, text)) or "\0" in text:
            problems.add(path, f"allow[{index}] {_show(text)}: not an absolute path or $VARIABLE",
                         'write the socket\'s full path ("/run/postgresql/.s.PGSQL.5432") or the variable '
                         'that holds it ("$SSH_AUTH_SOCK")')
            continue
        entries.append(text)
    return tuple(entries)


def unix_sockets_named(entries, env) -> tuple[list[tuple[str, str]], list[str]]:
    """[unix] allow resolved once, when the run starts: ([(entry as written,
    path)], [a warning for each entry that names nothing usable]). Pure."""
    named, warnings = [], []
    for entry in entries:
        path = env.get(entry[1:], "") if entry.startswith("$") else entry
        if not path:
            warnings.append(f"[unix] allow names {entry}, which is not set: that socket stays refused")
        elif not path.startswith("/"):
            warnings.append(f"[unix] allow names {entry} = {path!r}, not an absolute path: "
                            "that socket stays refused")
        else:
            named.append((entry, path))
    return named, warnings


def _parse_files(data: dict, problems: "_Problems") -> FileRules | None:
    if "files" not in data:
        return None
    body = data["files"]
    if not isinstance(body, dict):
        problems.add(("files",), f"files is {_type_name(body)}, not a table",
                     "write [files] on a line of its own, with deny_read and allow_write below it")
        return None
    for key in body:
        if key not in FILES_KEYS:
            problems.add(("files", key), f'unknown key "{key}" in [files]', _unknown(key, FILES_KEYS))
    lists: dict[str, tuple[FileEntry, ...] | None] = {}
    outside = body.get("outside", "read-only")
    if outside not in FILES_OUTSIDE:
        problems.add(("files", "outside"),
                     f"outside = {_show(outside) if isinstance(outside, str) else _type_name(outside)}: "
                     f"not one of " + ", ".join(f'"{v}"' for v in FILES_OUTSIDE),
                     'write outside = "held" (writes outside allow_write are held for you to '
                     'look at after the run) or outside = "read-only" (they fail)')
        outside = "read-only"
    for which in FILES_LISTS:
        if which not in body:
            lists[which] = None
            continue
        entries = []
        for index, text, path in _string_list(
                problems, ("files", which), body[which],
                f'write {which} = ["~/.ssh", "./secrets"]' if which == "deny_read"
                else f'write {which} = [".", "/tmp"]',
                'write each path in quotes, as "~/.ssh"') or ():
            bad = check_file_entry(text)
            if bad:
                problems.add(path, f"{which}[{index}] {_show(text)}: {bad[0]}", bad[1])
                continue
            entries.append(FileEntry(text, problems.line_of(path)))
        lists[which] = tuple(entries)
    return FileRules(deny_read=lists["deny_read"] or (), allow_write=lists["allow_write"],
                     outside=outside)


# --- the [secrets.NAME] tables (docs/secrets.md) --------------------------------
#
#     [secrets.openai]
#     host = "api.openai.com"
#     env = "OPENAI_API_KEY"
#     from = "env:OPENAI_API_KEY"      # or "command:gh auth token", "file:~/.config/openai/key"
#
# Only the words are checked here; the sources are read when a run starts
# (stages/config/secrets.py's fetch), never when a policy is only shown.

SECRET_KEYS = ("host", "env", "from", "header", "base_url_env", "allow", "cache", "hide")
_SECRET_NAME = r"[a-z0-9][a-z0-9_-]{0,39}"
_ENV_VARIABLE = r"[A-Za-z_][A-Za-z0-9_]*"
_HEADER_NAME = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_PATH_RULE = r"/[!-~]*"
MAX_CACHE = 24 * 3600


def _parse_secrets(data: dict, problems: "_Problems") -> tuple:
    if "secrets" not in data:
        return ()
    body = data["secrets"]
    example = '[secrets.openai] with host, env and from below it'
    if not isinstance(body, dict):
        problems.add(("secrets",), f"secrets is {_type_name(body)}, not a table", f"write {example}")
        return ()
    from stages.config import secrets as sc
    found, envs = [], {}
    for name, table in body.items():
        where = ("secrets", name)
        if not re.fullmatch(_SECRET_NAME, name):
            problems.add(where, f"secret name {_show(name)} is not a short lower-case word",
                         'write a name of letters, digits, - and _, as [secrets.openai]')
            continue
        if not isinstance(table, dict):
            problems.add(where, f"secrets.{name} is {_type_name(table)}, not a table",
                         f"write [secrets.{name}] on a line of its own, with host, env and from below it")
            continue
        secret = _secret(name, table, where, problems, sc)
        if secret is None:
            continue
        if secret.env and secret.env in envs:
            problems.add(where + ("env",), f'secrets {envs[secret.env]} and {name} both set {secret.env}',
                         "give each secret its own variable")
        if secret.env:
            envs[secret.env] = name
        found.append(secret)
    return tuple(found)


def _secret(name: str, table: dict, where: tuple, problems: "_Problems", sc):
    before = len(problems.found)
    for key in table:
        if key not in SECRET_KEYS:
            problems.add(where + (key,), f'unknown key "{key}" in [secrets.{name}]', _unknown(key, SECRET_KEYS))
    for key in ("host", "from"):
        if key not in table:
            problems.add(where, f"[secrets.{name}] has no {key}",
                         'add host = "api.openai.com"' if key == "host"
                         else 'add from = "env:OPENAI_API_KEY" (or "command:...", "file:...")')
    strings = {}
    for key in ("host", "env", "from", "header"):
        if key in table and not isinstance(table[key], str):
            problems.add(where + (key,), f"{key} is {_type_name(table[key])}, not a string",
                         f'write {key} in quotes')
        elif key in table:
            strings[key] = table[key]
    host, port = _secret_host(strings.get("host"), where, problems)
    env = strings.get("env")
    if env is not None and not re.fullmatch(_ENV_VARIABLE, env):
        problems.add(where + ("env",), f"env {_show(env)} is not a variable name",
                     'write the variable the program reads its key from, as env = "OPENAI_API_KEY"')
    source = strings.get("from")
    if source is not None:
        kind, sep, arg = source.partition(":")
        if not sep or kind not in sc.SOURCE_KINDS:
            problems.add(where + ("from",), f"from {_show(source)} names no source",
                         'write "env:VARIABLE", "command:COMMAND" or "file:PATH"'
                         + (f'; {_unknown(kind, sc.SOURCE_KINDS)}' if sep else ""))
        elif not arg.strip() or "\0" in arg:
            problems.add(where + ("from",), f"from {_show(source)} is empty after {kind}:",
                         f"write what to read after {kind}:")
        elif kind == "env" and not re.fullmatch(_ENV_VARIABLE, arg):
            problems.add(where + ("from",), f"from {_show(source)}: {_show(arg)} is not a variable name",
                         'write "env:OPENAI_API_KEY"')
        elif kind == "file" and (bad := check_file_entry(arg)) is not None:
            problems.add(where + ("from",), f"from {_show(source)}: {bad[0]}", bad[1])
    spec = sc.known(host) if host else None
    header = strings.get("header", spec.header if spec else sc.DEFAULT_HEADER)
    if "header" in strings:
        hname, colon, template = header.partition(":")
        if not colon or not re.fullmatch(_HEADER_NAME, hname.strip()) or not header.isprintable() \
                or not ("{}" in template or re.search(r"\{basic:[^{}:]+\}", template)):
            problems.add(where + ("header",), f"header {_show(header)} is not a header with {{}} for the value",
                         'write header = "Authorization: Bearer {}" (or "x-api-key: {}")')
    base_url_env = _secret_base_urls(table, where, problems, spec)
    allow = _secret_allow(table, where, problems)
    cache = table.get("cache", sc.DEFAULT_CACHE)
    if type(cache) is not int or not 1 <= cache <= MAX_CACHE:
        problems.add(where + ("cache",), f"cache is {_show(cache)}, not a number of seconds",
                     f"write cache = 3300 (seconds, 1 to {MAX_CACHE})")
    hide = []
    for index, text, path in _string_list(problems, where + ("hide",), table.get("hide", []),
                                          'write hide = ["~/.codex/auth.json"]',
                                          'write each path in quotes') or ():
        bad = check_file_entry(text)
        if bad:
            problems.add(path, f"hide[{index}] {_show(text)}: {bad[0]}", bad[1])
        else:
            hide.append(text)
    if len(problems.found) != before:
        return None
    if "hide" not in table:
        hide = list(spec.hide) if spec else []
    if source.startswith("file:"):
        hide.append(source[5:])     # the key's own file: never readable inside
    return sc.Secret(name=name, host=host, port=port, env=env, source=source, header=header,
                     base_url_env=base_url_env, allow=allow, cache=cache, hide=tuple(dict.fromkeys(hide)),
                     line=problems.line_of(where))


def _secret_host(text, where, problems):
    if text is None:
        return None, 443
    try:
        rule = parse_rule(text, None, "allow")
    except _BadRule as exc:
        problems.add(where + ("host",), f"host {_show(text)}: {exc.problem}", exc.fix)
        return None, 443
    if rule.kind == "wildcard" or rule.kind == "cidr":
        problems.add(where + ("host",), f"host {_show(text)} is not one host",
                     'a secret goes to one host: write host = "api.openai.com"')
        return None, 443
    host = rule.host if rule.kind == "name" else str(rule.network.network_address)
    return host, rule.port or 443


def _secret_base_urls(table, where, problems, spec) -> tuple:
    if "base_url_env" not in table:
        return tuple(spec.base_url_env) if spec else ()
    out = []
    for index, text, path in _string_list(problems, where + ("base_url_env",), table["base_url_env"],
                                          'write base_url_env = ["OPENAI_BASE_URL"]',
                                          'write each variable in quotes') or ():
        variable, eq, suffix = text.partition("=")
        if not re.fullmatch(_ENV_VARIABLE, variable) or (eq and not re.fullmatch(r"(/[!-~]*)?", suffix)):
            problems.add(path, f"base_url_env[{index}] {_show(text)} is not VARIABLE or VARIABLE=/path",
                         'write "OPENAI_BASE_URL", or "MY_BASE_URL=/v1" for a path after the door')
            continue
        if not eq:
            known_path = dict(spec.base_url_env).get(variable, "") if spec else ""
            suffix = known_path
        out.append((variable, suffix))
    return tuple(out)


def _secret_allow(table, where, problems):
    if "allow" not in table:
        return None
    out = []
    for index, text, path in _string_list(problems, where + ("allow",), table["allow"],
                                          'write allow = ["POST /v1/chat/completions"]',
                                          'write each rule in quotes, as "GET /v1/models"') or ():
        method, _, rule_path = text.partition(" ")
        if not (method == "*" or re.fullmatch(r"[A-Z]+", method)) or not re.fullmatch(_PATH_RULE, rule_path) \
                or "*" in rule_path[:-1]:
            problems.add(path, f"allow[{index}] {_show(text)} is not METHOD /path",
                         'write "POST /v1/chat/completions", "GET /v1/models/*" or "* /v1/*"')
            continue
        prefix = rule_path.endswith("*")
        out.append((method, rule_path[:-1] if prefix else rule_path, prefix))
    return tuple(out)

"""The decision: six steps, in order, the first that decides wins.

1. deny rules on the name;
2. deny rules on every address the name resolved to;
3. deny_private on every address;
4. the machine itself, on the name and on every address (every run, with a
   policy or without): its loopback, its own interface addresses, link-local
   ranges and cloud metadata addresses are refused unless a rule names them;
5. allow rules;
6. the default (deny when there is an allow list).

Step 4 (docs/architecture.md "The machine itself"): the loopback (a name
below localhost, 127.0.0.0/8, ::1, 0.0.0.0/8, ::) is opened only by the door
an allow rule `localhost:PORT` opens inside the sandbox, never at a proxy
door or through capture; an own interface address, a link-local or a
metadata address only by an allow rule written as an address or range that
holds it (`169.254.169.254:80`), never by a name rule or the default. A name
the other steps let through without its addresses is judged on the addresses
it is looked up at to be dialled (`machine_check`), before the dial; on a
path that resolves names at its exit only the name and address literals can
be judged.

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

from stages.startup.records import NamedTuple   # not dataclasses: the loop's import (records.py)
from stages.config.addresses import (
    SPECIAL_LAST_LABELS, BadHost, classify, classify_name, embedded_ipv4, machine_address,
    machine_name, parse_host,
)
from stages.config.host_rules import Rule
from stages.config.policy import Policy, localhost_rule


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
    rule: str             # machine | deny_private | default | deny "<text>" (line N) | allow "<text>" (line N) | no policy | target
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
    overrides when one matches (deny_private comes first, step 3 before 5):
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


MACHINE = "machine"      # Decision.rule of step 4


def _address_rule(ip, port: int) -> str:
    return f"[{ip}]:{port}" if isinstance(ip, IPv6Address) else f"{ip}:{port}"


def _add(policy: Policy, rule_text: str) -> str:
    if policy.no_policy:
        return f'run it under a policy (--policy) whose allow list holds "{rule_text}"'
    return f'add "{rule_text}" to the allow list of {policy.source or "the policy"}'


def _loopback(target: Target, policy: Policy, what: str, addresses: tuple = ()) -> Decision:
    """Step 4 for the loopback: only the door `localhost:PORT` reaches it."""
    port = target.port
    rule = None if policy.no_policy else localhost_rule(policy, port)
    if rule is not None:
        fix = (f'the allow rule "{rule.text}" ({policy.where(rule)}) opens it only at its own door '
               f"inside the sandbox: connect to localhost:{port} directly, not through the proxy")
    else:
        fix = (f"to let the program reach a service on this machine's port {port}, "
               f"{_add(policy, f'localhost:{port}')} (it opens a door on that port inside the sandbox)")
    return _deny(f"{what}, which vpnw never dials for the program; {fix}", MACHINE, addresses)


def _machine_addresses(target: Target, policy: Policy, addresses: tuple, local) -> Decision | None:
    """Step 4 on every address: None when none is the machine itself, or
    each that is has an address allow rule naming it."""
    is_name = target.ip is None
    for ip in addresses:
        found = machine_address(ip, local)
        if found is None:
            continue
        kind, judged, what = found
        subject = f"{target} resolved to {ip}" if is_name else f"{target}"
        if judged != ip:
            subject += f", an IPv6 form of {judged}"
        if kind == "loopback":
            return _loopback(target, policy, f"{subject}: {what}", addresses)
        if not policy.no_policy:
            rule = _match_address(policy.allow_index, ip, target.port, through_nat64=False)
            if rule is not None and rule.network.prefixlen > 0:
                continue       # named by an address rule: the machine step lets it through
        how = " (a name rule does not open it, an address rule does)" if is_name else ""
        return _deny(f"{subject}: {what}, which vpnw never dials without a rule naming it; to allow "
                     f"it, {_add(policy, _address_rule(ip, target.port))}{how}", MACHINE, addresses)
    return None


def decide(target: Target, policy: Policy, addresses=None, *,
           local_addresses=frozenset(), resolves_at_exit: bool = False,
           machine_step: bool = True) -> Decision | LookUp:
    """The six steps. `addresses`: None before a look-up, else every address
    the name resolved to. IP-literal targets never need a look-up. Without a
    policy only step 4 applies. `machine_step=False` leaves step 4 out: only
    for the broker's own tests, whose origins listen on the machine's
    loopback (vpnw never passes it; see Connector)."""
    is_name = target.ip is None
    if is_name:
        refused = _name_steps(target, policy, machine_step)     # 1, 3 and 4 on the name
        if refused is not None:
            return refused

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
        addresses = tuple(dict.fromkeys(_as_address(a) for a in addresses))
        if not addresses:
            return _deny(f"{target.host} resolved to no address", "target")
        refused = _address_steps(target, policy, addresses, local_addresses, machine_step)  # 2, 3, 4
        if refused is not None:
            return refused
    else:
        addresses = ()

    if policy.no_policy:
        return Decision(True, "no policy: every connection is allowed but to the machine itself",
                        "no policy", addresses)
    allowed = _allow_rules(target, policy, addresses)          # 5
    if allowed is not None:
        return allowed
    return _default(target, policy, addresses)                 # 6


def _name_steps(target: Target, policy: Policy, machine_step: bool) -> Decision | None:
    """Steps 1, 3 and 4 on the name, before any look-up: a refusal, or None."""
    host, port = target.host, target.port
    # 1. deny rules on the name
    if not policy.no_policy:
        rule = policy.deny_index.match_name(host, port)
        if rule is not None:
            return _deny(f'{target} matches deny rule "{rule.text}" ({policy.where(rule)})',
                         f"deny {rule.label()}")
    # 3, by name: deny_private refuses names that stay on this machine or
    # in a private network before they are looked up.
    if not policy.no_policy and policy.deny_private:
        dot = host.rfind(".")
        # Inline fast path: most names end in a label no special name has.
        if dot == -1 or host[dot + 1:] in SPECIAL_LAST_LABELS:
            why = classify_name(host)
            if why is not None:
                return _deny_private(f"{host}: {why}", target, policy)
    # 4, by name: localhost and every name below it, before any look-up.
    if machine_step and (host.endswith("localhost") or host == "localhost.localdomain"):
        why = machine_name(host)
        if why is not None:
            return _loopback(target, policy, f"{host}: {why}")
    return None


def _address_steps(target: Target, policy: Policy, addresses: tuple, local_addresses,
                   machine_step: bool) -> Decision | None:
    """Steps 2, 3 and 4 on every address (the literal, or what the name
    resolved to): a refusal, or None."""
    is_name = target.ip is None
    # A frozenset is taken as it is: the broker makes one per run, of
    # address objects without scope ids (local_addresses.py). Any other
    # iterable is normalised here, at the cost of a set per decision.
    local = local_addresses if type(local_addresses) is frozenset else frozenset(
        _as_address(a) for a in local_addresses)
    # 2. deny rules on every address
    if not policy.no_policy:
        for ip in addresses:
            rule = _match_address(policy.deny_index, ip, target.port, through_nat64=True)
            if rule is not None:
                subject = f"{target} resolved to {ip}, which" if is_name else f"{target}"
                return _deny(f'{subject} matches deny rule "{rule.text}" ({policy.where(rule)})',
                             f"deny {rule.label()}", addresses)
    # 3. deny_private on every address
    if not policy.no_policy and policy.deny_private:
        for ip in addresses:
            why = classify(ip, local)
            if why is not None:
                return _deny_private(f"{target.host} resolved to {why}" if is_name else why,
                                     target, policy, addresses)
    # 4. the machine itself, on every address
    return _machine_addresses(target, policy, addresses, local) if machine_step else None


def _allow_rules(target: Target, policy: Policy, addresses: tuple) -> Decision | None:
    """Step 5: the name matches an allow rule, or the address literal does."""
    if target.ip is None:
        rule = policy.allow_index.match_name(target.host, target.port)
    elif policy.allow_index.has_address_rules:
        # Address allow rules apply to address literals only (see above).
        rule = _match_address(policy.allow_index, target.ip, target.port, through_nat64=False)
    else:
        rule = None
    if rule is None:
        return None
    return Decision(True, f'{target} matches allow rule "{rule.text}" ({policy.where(rule)})',
                    f"allow {rule.label()}", addresses)


def addresses_matter(target: Target, policy: Policy) -> bool:
    """Whether an address of this name could refuse it (deny rules on
    addresses, deny_private): what a name the person allowed (--ask) must
    still be checked against once looked up. Step 4 is not counted: the
    broker judges every address it dials (`machine_check`)."""
    return bool(policy.deny_private or policy.deny_index.address_rules_for_port(target.port))


def machine_check(target: Target, policy: Policy, addresses, local_addresses=frozenset()) -> Decision | None:
    """Step 4 on the addresses a name allowed without them was looked up at,
    to be dialled: a refusal (a Decision, rule "machine"), or None. The
    broker calls it on every address it is about to dial that decide() did
    not see, so no allowed name reaches the machine itself."""
    if target.ip is not None or not addresses:
        return None
    addresses = tuple(dict.fromkeys(_as_address(a) for a in addresses))
    local = local_addresses if type(local_addresses) is frozenset else frozenset(
        _as_address(a) for a in local_addresses)
    return _machine_addresses(target, policy, addresses, local)


def _address_could_change_answer(target: Target, policy: Policy) -> bool:
    """Step 1 has passed. Would any address move the decision for this name?
    Only a refusal can: address allow rules never apply to names. Step 4 is
    not counted: it judges the addresses the name is dialled at, looked up
    to dial it (`machine_check`), never a look-up of its own."""
    if policy.no_policy:
        return False
    port = target.port
    if policy.default == "deny" and policy.allow_index.match_name(target.host, port) is None:
        return False         # nothing can allow it: never look it up
    return policy.deny_private or policy.deny_index.address_rules_for_port(port)


def _name_rules(index, name: str):
    """Every rule of `index` that names `name`, whatever its port."""
    yield from index.exact.get(name, ())
    dot = name.find(".")
    while dot != -1:
        yield from index.wildcard.get(name[dot + 1:], ())
        dot = name.find(".", dot + 1)


def name_refusal(host: str, policy: Policy, *, asks: bool = False) -> str | None:
    """Pure, for the DNS door (docs/architecture.md "The DNS door"): why the
    canonical name `host` is refused at every port, by name alone, as the
    doors would say it; None when some port of it could be allowed, or only
    its addresses could refuse it (the door then hands out an address and
    the policy decides at the connection). `asks`: guard --ask, whose
    default asks the person rather than refusing."""
    if not policy.no_policy:
        for rule in _name_rules(policy.deny_index, host):
            if rule.port is None:
                return f'{host} matches deny rule "{rule.text}" ({policy.where(rule)})'
        if policy.deny_private:
            why = classify_name(host)
            if why is not None:
                return (f"{host}: {why}; refused by deny_private = true "
                        f"(set in {policy.source or 'the policy'})")
    why = machine_name(host)
    if why is not None:
        return (f"{host}: {why}, which vpnw never dials for the program; an allow rule "
                f'"localhost:PORT" opens a door on that port inside the sandbox')
    if policy.no_policy or asks or policy.default != "deny":
        return None
    if next(_name_rules(policy.allow_index, host), None) is not None:
        return None
    return _default(Target(host, 0, None), policy, ()).reason.replace(f"{host}:0", host)

"""The policy: a frozen `Policy`, what the stages ask of it, and
`load_policy`/`parse_policy`, which make one from a file or a PolicyError
that names the file, the line and the fix.

    version = 1
    name = "agent"

    [policy]
    default = "deny"          # "allow" | "deny"; absent: deny when there is an allow list
    deny_private = true       # absent: false
    allow = ["api.github.com", "*.pythonhosted.org", "140.82.112.0/20", "[2001:db8::1]:443"]
    deny = ["*.example"]

Choices the policy makes (the description leaves them open):
- `deny_private` is false unless the file sets it. The description's example
  writes `deny_private = true` explicitly, and learn's drafts do the same.
- "there is an allow list" means the `allow` key is present, even when empty:
  `allow = []` with no default denies everything.
- `name` may be left out; it then defaults to the file's name without `.toml`.

Where the rest lives: the rule grammar in host_rules.py, the index the
broker matches against in rule_index.py, the reading of the file's words in
policy_file.py (its top keys and [policy]) and policy_tables.py ([files],
[unix], [secrets.NAME]), the collecting of its problems in
policy_problems.py.
"""
from __future__ import annotations

from stages.config.errors import PolicyError
from stages.config.inputs import InputProblem, read_text, source_name
from stages.config.rule_index import RuleIndex
from stages.record.events import DENY_PRIVATE_SCOPES
from stages.startup.records import FrozenRecord   # not dataclasses (docs/architecture.md "Start-up budget")


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
    # addresses (and ipaddress) came with the policy's rules (host_rules.py);
    # imported here, not at the top, so that a run without a policy loads neither.
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



def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Policy text -> Policy, or PolicyError naming source and line."""
    # Only a run that names a policy reads one: tomllib, the rule grammar and
    # ipaddress stay off the start of a run without (docs/architecture.md
    # "Start-up budget"; tests/test_startup_imports.py).
    from stages.config.policy_file import policy_fields
    return Policy(**policy_fields(text, source))


def load_policy(path: str, *, stdin=None) -> Policy:
    """Read and parse a policy file ("-": stdin). Every problem, with the
    input or in it, is a PolicyError: `file[:line]: problem; fix: ...`."""
    source = source_name(path)
    try:
        text = read_text(path, "policy", stdin=stdin)
    except InputProblem as exc:
        where = f"{source}:{exc.line}" if exc.line else source
        raise PolicyError(f"{where}: {exc.problem}; fix: {exc.fix}", source=source,
                          line=exc.line) from None
    return parse_policy(text, source=source)


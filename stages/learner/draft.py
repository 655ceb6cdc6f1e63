"""Draft a policy from recorded runs (pure: events in, TOML text out).

The events are gathered by learned.py; this module writes out what was
gathered. The draft allows what the program did, including anything it should not have
done; that is why it opens with "Read it before you use it" and why the
`needs review` block lists what a person should look at. Suggestions (such as
a wildcard) are comments only: the draft never allows more than was seen.

Memory grows with the number of distinct destinations (and connections open
at one time), never with the length of the record. The output depends only on
the events: same record, byte-identical draft (everything is sorted; nothing
reads the clock).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Iterable

from stages.config.addresses import (
    BadHost, classify, classify_name, machine_address, machine_name, parse_host,
)
from stages.config.command_sockets import command_server
from stages.config.secrets import KEY_VARIABLES
from stages.learner.generated_names import generated_labels, looks_generated
from stages.learner.learned import SSH_AUTH_SOCK, Learner, learn
from stages.record.destinations import Destination
from stages.record.text import human_bytes, printable

PLAIN_PORTS = (80, 443)
WILDCARD_MIN_NAMES = 3
_MAX_LISTED = 8                  # names shown per wildcard suggestion
# Second-level labels under which registrations happen (co.uk, com.au, ...):
# never suggest "*.co.uk". A short list, not the Public Suffix List.
_SHARED_SECOND_LEVEL = {"co", "com", "net", "org", "gov", "edu", "ac", "or", "ne", "go"}


def _classify(address: str) -> str | None:
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return None
    return classify(ip)


# --- rendering -------------------------------------------------------------------

def toml_string(text: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0:
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _canonical(host: str):
    """(kind, canonical text, sort key) or None when the host cannot be a rule."""
    try:
        value = parse_host(host)
    except BadHost:
        return None
    if isinstance(value, str):
        return ("name", value, (0, tuple(reversed(value.split("."))), 0))
    return ("ip", str(value), (1, (value.version,), int(value)))


def _rule(kind: str, host: str, port: int | None) -> str:
    if port is None:
        return host
    if kind == "ip" and ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def _when(ts: str | None) -> str:
    return f"{ts[:10]} {ts[11:19]}Z" if ts and len(ts) >= 19 else "?"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass
class _Entry:
    rule: str
    kind: str
    host: str
    sort: tuple
    connections: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    first: str | None = None
    last: str | None = None

    def add(self, dest: Destination) -> None:
        self.connections += dest.opened
        self.bytes_up += dest.bytes_up
        self.bytes_down += dest.bytes_down
        if dest.first and (self.first is None or dest.first < self.first):
            self.first = dest.first
        if dest.last and (self.last is None or dest.last > self.last):
            self.last = dest.last

    def evidence(self) -> str:
        seen = _when(self.first)
        if self.last and self.last[:19] != (self.first or "")[:19]:
            same_day = self.last[:10] == (self.first or "")[:10]
            seen += " .. " + (f"{self.last[11:19]}Z" if same_day else _when(self.last))
        return (f"{_plural(self.connections, 'connection')}, up {human_bytes(self.bytes_up)}, "
                f"down {human_bytes(self.bytes_down)}, {seen}")


def _wildcards(names: list[str]) -> list[tuple[str, list[str]]]:
    """(suffix, names under it) for every suffix with enough names, deepest
    first; an ancestor that covers exactly the same names is left out."""
    below: dict[str, list[str]] = {}
    for name in names:
        labels = name.split(".")
        for i in range(1, len(labels) - 1):
            suffix_labels = labels[i:]
            if len(suffix_labels) == 2 and suffix_labels[0] in _SHARED_SECOND_LEVEL:
                continue
            below.setdefault(".".join(suffix_labels), []).append(name)
    chosen: list[tuple[str, list[str]]] = []
    for suffix in sorted(below, key=lambda s: (-s.count("."), s)):
        members = sorted(set(below[suffix]))
        if len(members) < WILDCARD_MIN_NAMES:
            continue
        if any(other.endswith("." + suffix) and set(m) == set(members) for other, m in chosen):
            continue
        chosen.append((suffix, members))
    return sorted(chosen, key=lambda c: tuple(reversed(c[0].split("."))))


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True


def _clean_name(name: str) -> str:
    name = printable(name).strip()
    return name[:200] or "agent"


REVIEW_HEADINGS = {
    "denied": "Denied during the run; listed commented out in allow, not allowed:",
    "would_deny": "Would have been denied by the policy in force (dry run); allowed here:",
    "ip": "Raw IP addresses (no name):",
    "special": "Private or special addresses and names:",
    "exit": "Resolved at the exit (addresses never seen):",
    "ports": "Ports other than 80 and 443:",
    "once": "Seen only once (one connection):",
    "generated": "Names that look generated:",
    "wildcard": "Wildcards you could use instead (not applied):",
    "unreached": "Tried but never reached (not allowed):",
    "invalid": "Left out:",
}


@dataclass
class _Draft:
    """What the runs say, sorted for the draft: its allow entries and what a
    person should review."""
    entries: dict[str, _Entry] = field(default_factory=dict)
    captured: bool = False     # capture = true in the draft: the traced program needed it
    review: dict[str, list] = field(default_factory=lambda: {k: [] for k in REVIEW_HEADINGS})
    hosts_reached: dict[str, tuple] = field(default_factory=dict)
    exit_resolved: set[str] = field(default_factory=set)   # names opened where the exit resolved them
    private: set[str] = field(default_factory=set)   # allowed targets deny_private = true would refuse


def render(learner: Learner, name: str) -> str:
    draft = _Draft(captured=learner.captured)
    for (host, port), dest in sorted(learner.tally.table.items()):
        _take_destination(draft, host, port, dest)
    _review_hosts(draft)
    clean = _clean_name(name)
    out = _header(learner, clean, draft.review)
    out += _policy_table(draft, clean)
    held = _held_lines(learner)
    if held:
        out = out[:-1] + held + [""] if out and out[-1] == "" else out + held
    out += _unix_table(learner)
    out += _secrets_suggested(learner)
    return "\n".join(out)


def _held_lines(learner: Learner) -> list[str]:
    """allow_write suggestions from what the runs wrote outside their work
    set (held, never applied). What runs later on its own is only ever a
    comment inside the comment, saying why."""
    if not learner.held:
        return []
    out = ["# The traced runs wrote outside their work set; those writes were held, not",
           "# applied (see `vpnw changes RUN`). For a program to keep such writes, add",
           "# their folders to allow_write above:"]
    for key, (count, later) in sorted(learner.held.items(), key=lambda kv: (kv[1][1] is not None, kv[0])):
        if later:
            out.append(f"#     # {toml_string(key)},  # {_plural(count, 'write')} held; runs later on "
                       f"its own ({printable(later)}): what is planted there runs outside the sandbox")
        else:
            out.append(f"#     {toml_string(key)},  # {_plural(count, 'write')} held")
    return out


def _secrets_suggested(learner: Learner) -> list[str]:
    """A [secrets] table, commented out, for each known API host the runs
    reached while the program held that API's key in its environment
    (run.start's keys_given): with it the key stays outside (docs/secrets.md)."""
    reached = {host for host, _ in learner.tally.table}
    out = []
    for host, variable in sorted(KEY_VARIABLES.items()):
        if host not in reached or variable not in learner.keys_given:
            continue
        name = host.split(".")[-2] if host.count(".") >= 1 else host
        out += [f"# The program held {variable} and reached {host}: keep the key outside,",
                "# behind a secret door (docs/secrets.md), by uncommenting:",
                f"# [secrets.{name}]", f"# host = {toml_string(host)}", f"# env = {toml_string(variable)}",
                f"# from = {toml_string('env:' + variable)}", ""]
    return out


def _unix_table(learner: Learner) -> list[str]:
    """[unix] allow: the sockets the policy named, kept; the ones refused,
    commented out (a person decides: a socket outside is a way out); a
    socket whose server runs commands outside the sandbox (tmux, Docker,
    the D-Bus buses...: stages/config/command_sockets.py) is never offered,
    only named as what stays refused."""
    if not learner.unix_allowed and not learner.unix_refused:
        return []

    def line(key: str, count: int, programs: set, what: str) -> str:
        who = ", ".join(sorted(programs)) or "?"
        agent = ("; the ssh agent's socket, whose path changes at each login"
                 if key == SSH_AUTH_SOCK and what == "refused" else "")
        return f"{toml_string(key)},  # {_plural(count, 'connect')} {what} ({who}){agent}"
    refused_items = sorted(learner.unix_refused.items())
    never = [f"#   {printable(k)}: {command_server(k)} ({_plural(c, 'connect')} refused)"
             for k, (c, _p) in refused_items if command_server(k)]
    refused = [line(k, c, p, "refused") for k, (c, p) in refused_items if not command_server(k)]
    never_lines = (["# Refused, and never to be allowed: their servers run commands outside the",
                    "# sandbox for whoever connects:", *never, ""] if never else [])
    if not learner.unix_allowed:
        if not refused:
            return never_lines
        return never_lines + [
                "# Unix sockets outside the sandbox the program asked for and was refused",
                "# (a suggestion, not applied: each is a way out of the sandbox):",
                "# [unix]", "# allow = [", *(f"#     {text}" for text in refused), "# ]", ""]
    out = never_lines + ["[unix]", "allow = ["]
    for k, (c, p) in sorted(learner.unix_allowed.items()):
        if command_server(k):
            out.append(f"    # CHECK: {printable(k)} is {command_server(k)}, which runs commands "
                       "outside the sandbox:")
        out.append(f"    {line(k, c, p, 'allowed')}")
    if refused:
        out.append("    # Refused during the run (uncomment only if the program must reach it):")
        out += [f"    # {text}" for text in refused]
    return out + ["]", ""]


def _take_destination(draft: _Draft, host: str, port: int, dest) -> None:
    review = draft.review
    canon = _canonical(host)
    if canon is None:
        if dest.opened:
            review["invalid"].append(((9,), port, f"{printable(host)}:{port}: not a host a "
                                      "rule can name"))
        return
    kind, chost, sort = canon
    target = _rule(kind, chost, port)
    if dest.opened == 0:
        if dest.denied:
            why = f"denied {_plural(dest.denied, 'time')}: {printable(dest.deny_reason or '')}"
            if _machine_loopback(kind, chost):
                # Guard reaches the machine's loopback only through the door
                # `localhost:PORT` opens inside the sandbox, never at a proxy
                # door: that is the rule to suggest, and what it does.
                target = _rule("name", "localhost", port)
                why += (f"; the rule {target} opens a door on port {port} inside the sandbox to this "
                        f"machine's own service (the program connects to localhost:{port} itself, "
                        "not through the proxy)")
            review["denied"].append((sort, port, target, why))
        elif dest.failed:
            review["unreached"].append((sort, port, f"{target}: {_plural(dest.failed, 'attempt')}"
                                        f" failed ({printable(dest.fail_reason or '')})"))
        return
    # The machine's own services: a door opens only for exactly localhost:PORT.
    keep_port = port not in PLAIN_PORTS or chost == "localhost"
    rule = _rule(kind, chost, port if keep_port else None)
    entry = draft.entries.get(rule)
    if entry is None:
        entry = draft.entries[rule] = _Entry(rule, kind, chost,
                                             sort + (port if keep_port else 0,))
    entry.add(dest)
    draft.hosts_reached[chost] = (kind, sort)
    if dest.would_deny:
        review["would_deny"].append((sort, port, f"{target}: the policy in force would deny it "
                                     f"({printable(dest.would_deny_reason or '')})"))
    special = next(filter(None, map(_classify, dest.addresses)), None)
    if special and chost == "localhost" and kind == "name":
        # Reached at the door `localhost:PORT` opens (or would open): what
        # guard does with this rule, whatever deny_private says.
        review["special"].append((sort, port, f"{target}: this machine's own service; the rule opens "
                                  f"a door on port {port} inside the sandbox and nothing else of the "
                                  "machine's loopback (deny_private does not refuse it)"))
    elif special:
        private = any(map(_in_private_network, dest.addresses))
        if private:
            draft.private.add(target)
        review["special"].append((sort, port, f"{target}: reached at {printable(special)}; " + (
            "deny_private = false below lets it through" if private else "deny_private = true refuses it")))
    if kind == "name":
        why = classify_name(chost) if chost != "localhost" else None   # localhost:PORT is its own door
        if why:
            private = _private_network_name(chost)
            if private:
                draft.private.add(target)
            review["special"].append((sort, port, f"{target}: {why}; " + (
                "deny_private = false below lets this name through" if private else
                "deny_private = true refuses this name before any look-up")))
        if any(not _is_address(a) for a in dest.addresses):
            draft.exit_resolved.add(chost)
    if port not in PLAIN_PORTS:
        review["ports"].append((sort, port, f"{target}: port {port} is neither 80 nor 443"))


# What an office or a home network is reached by: the private ranges (RFC
# 1918, IPv6 unique local) and the names only such a network answers
# (.internal, .home.arpa, .local). A trace that reached one needed
# deny_private = false. Loopback, link-local and the cloud metadata names
# and ranges, documentation and other special ranges never make the draft
# drop deny_private: they stay flagged for review.
_PRIVATE_NETWORKS = tuple(ipaddress.ip_network(n) for n in
                          ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))
_PRIVATE_NAME_SUFFIXES = ("internal", "home.arpa", "local")


def _machine_loopback(kind: str, host: str) -> bool:
    """Whether a target is the machine's own loopback (decide.py step 4),
    which only a `localhost:PORT` door reaches."""
    if kind == "name":
        return machine_name(host) is not None
    found = machine_address(host)
    return found is not None and found.kind == "loopback"


def _in_private_network(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    return any(ip in network for network in _PRIVATE_NETWORKS if network.version == ip.version)


def _private_network_name(name: str) -> bool:
    for suffix in _PRIVATE_NAME_SUFFIXES:
        # A suffix's own reason: a metadata name under it (metadata.google.internal) has its own.
        if name.endswith("." + suffix) and classify_name(name) == classify_name(suffix):
            return True
    return False


def _review_hosts(draft: _Draft) -> None:
    """What only the whole run shows: names resolved at the exit, raw
    addresses, generated names, hosts seen once, wildcards."""
    review = draft.review
    if draft.exit_resolved:
        names = sorted(draft.exit_resolved)
        shown = ", ".join(names[:_MAX_LISTED]) + (", ..." if len(names) > _MAX_LISTED else "")
        review["exit"].append(((0,), 0, f"{_plural(len(names), 'name')} ({shown}) were resolved "
                               "at the exit of a socks5h:// or http:// path, so vpnw never saw their "
                               "addresses" + ("" if draft.private else ": on such a path "
                               "deny_private = true below covers address literals and special "
                               "names only")))
    for chost, (kind, sort) in draft.hosts_reached.items():
        if kind == "ip":
            review["ip"].append((sort, 0, f"{_rule(kind, chost, None)}: an address with no name "
                                 "(its rule allows requests for the address only, never a name); "
                                 "find out what it is"))
        else:
            labels = generated_labels(chost)
            if labels:
                review["generated"].append((sort, 0, f"{chost}: {', '.join(labels)} looks generated "
                                            "(encoded data, as DNS tunnels and exfiltration use)"))
    for entry in draft.entries.values():
        if entry.connections == 1:
            review["once"].append((entry.sort, 0, f"{entry.rule}: seen once"))
    names = sorted(h for h, (kind, _) in draft.hosts_reached.items() if kind == "name")
    for suffix, members in _wildcards(names):
        shown = ", ".join(members[:_MAX_LISTED]) + (", ..." if len(members) > _MAX_LISTED else "")
        generated = sum(1 for m in members
                        if any(looks_generated(label) for label in m[:-len(suffix) - 1].split(".")))
        if generated * 2 >= len(members):
            advice = ("most look generated, the shape of a DNS tunnel: do NOT use a wildcard here; "
                      "find out why the program made up these names")
        else:
            advice = "a wildcard would allow every name below it, so it is only suggested"
        review["wildcard"].append(((0, tuple(reversed(suffix.split(".")))), 0,
                                   f"*.{suffix} could replace {len(members)} names ({shown}); {advice}"))


def _header(learner: Learner, clean: str, review: dict) -> list[str]:
    out = ["# Read it before you use it.", "#"]
    runs = sorted(learner.runs.items(), key=lambda r: (r[1][0], r[0]))
    out.append(f"# A draft policy for {printable(clean)}, learned by vpnw from "
               f"{_plural(len(runs), 'run')}:")
    for run_id, (ts, mode, program) in runs:
        out.append(f"#   {printable(run_id)}  {printable(mode)}  {printable(program)}  {_when(ts)}")
    out += ["#",
            "# It allows every destination the program reached, including any it should",
            "# not have reached. Remove what you do not recognise, then enforce it with",
            f"#   {guard_command(learner.paths, clean)}",
            "#"]
    items = [(k, v) for k, v in review.items() if v and k != "denied"]
    if items or review["denied"]:
        out.append("# Needs review:")
        if review["denied"]:
            out.append(f"#   {REVIEW_HEADINGS['denied']}")
            for _, _, target, why in sorted(review["denied"]):
                out.append(f"#     {target}: {why}")
        for key, lines in items:
            out.append(f"#   {REVIEW_HEADINGS[key]}")
            for _, _, text in sorted(lines):
                out.append(f"#     {text}")
    else:
        out.append("# Needs review: nothing flagged; still read the allow list below.")
    return out + ["#"]


def guard_command(paths: set[tuple], clean: str) -> str:
    """The command that enforces the draft, on the path the trace took: a run
    through a named path keeps its --config and --via (a draft learned over
    the office, enforced without it, would send the program direct). Several
    paths: the first, sorted; a record too old to name its config: PATHS.toml."""
    named = sorted((via, config or "PATHS.toml") for via, config in paths if via != "direct")
    where = ""
    if named:
        via, config = named[0]
        where = f"--config {_shell_word(config)} --via {_shell_word(via)} "
    return f"vpnw guard {where}--policy {_shell_word(printable(clean) + '.toml')} -- PROGRAM"


def _shell_word(text: str) -> str:
    text = printable(text)
    if text and all(ch.isalnum() or ch in "@%+=:,./_-" for ch in text):
        return text
    return "'" + text.replace("'", "'\\''") + "'"


def _deny_private_lines(draft: _Draft) -> list[str]:
    """deny_private = true, unless the trace needed private destinations:
    true would refuse them before any allow rule below (it comes first), so
    the draft would contradict itself. Then false, and why."""
    if not draft.private:
        return ["deny_private = true"]
    shown = sorted(draft.private)
    listed = ", ".join(shown[:_MAX_LISTED]) + (", ..." if len(shown) > _MAX_LISTED else "")
    return ["# The traced program reached private destinations (" + listed + "):",
            "# deny_private = true would refuse them before any allow rule below.",
            "deny_private = false"]


def _policy_table(draft: _Draft, clean: str) -> list[str]:
    denied = draft.review["denied"]
    out = ["", "version = 1", f"name = {toml_string(clean)}", "", "[policy]",
           'default = "deny"', *_deny_private_lines(draft)]
    if draft.captured:
        out.append("capture = true   # the traced runs captured what ignores the proxy settings")
    ordered = sorted(draft.entries.values(), key=lambda e: e.sort)
    if not ordered and not denied:
        out.append("allow = []")
    else:
        out.append("allow = [")
        width = min(44, max((len(toml_string(e.rule)) + 1 for e in ordered), default=0))
        for e in ordered:
            out.append(f"    {(toml_string(e.rule) + ','):<{width}}  # {e.evidence()}")
        if denied:
            out.append("    # Denied during the run (kept out; uncomment only if you are sure):")
            for _, _, target, why in sorted(denied):
                out.append(f"    # {toml_string(target)},  # {why}")
        out.append("]")
    return out + ["deny = []", "", *FILES_SUGGESTION, ""]


# A trace cannot tell which files a program needs, so the draft only
# suggests file limits, commented out, for a person to decide on.
SECRET_LOCATIONS = ("~/.ssh", "~/.aws", "~/.config/gcloud", "~/.azure", "~/.kube",
                    "~/.docker/config.json", "~/.netrc", "~/.git-credentials", "~/.gnupg",
                    "~/.npmrc", "~/.pypirc", "~/.config/gh")
FILES_SUGGESTION = (
    "# File limits (a suggestion, not applied: uncomment after checking). The usual",
    "# places secrets live are hidden from the program, and it may write only in the",
    "# directory vpnw starts in and in /tmp:",
    "# [files]",
    "# deny_read = [",
    *(f"#     {toml_string(path)}," for path in SECRET_LOCATIONS),
    "# ]",
    '# allow_write = [".", "/tmp"]',
)


def draft_policy(events: Iterable[dict], name: str | None = None,
                 ssh_auth_sock: str | None = None) -> str:
    """Recorded events (one run or several, in any order of runs) -> the text
    of a draft policy named `name` (None: the program of the first run).
    NoRuns when they hold no run: an empty draft would allow nothing and say
    it was learned. `ssh_auth_sock`: the learner's $SSH_AUTH_SOCK; a refused
    socket at that path (or at OpenSSH's agent path) is drafted as the
    variable, which stays right after the next login."""
    learner = learn(events, ssh_auth_sock)
    return render(learner, name or learner.first_program or "agent")

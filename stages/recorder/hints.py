"""The closing hints: what vpnw says after the summary of a run that failed,
and only on evidence in the run's own events.

Sans-I/O: `RunFacts.note(event)` takes each event as the recorder sees it;
`closing_hints(facts)` is pure. A run that ended 0 gets no hint, nor one
whose program never ran, nor one with no evidence (a plain `exit 1`), nor
one whose program a person or the system stopped (Ctrl-C, `kill`, a hang-up:
SIGINT, SIGTERM, SIGHUP, SIGQUIT or SIGKILL, or the shell's 130 for Ctrl-C),
whatever it met before: the person knows why it ended. The evidence:

- `program.exit`'s `no_route`: the sandbox's network refused the program a
  way out that was not a door (it may ignore the proxy settings: plain ssh,
  `getent`, Node 20's `fetch`); without capture the hint names `--capture`,
  which sends such connections through vpnw's doors;
- a `conn.fail` of kind `dns`: a name could not be resolved; so could not
  a name the program looked up itself and the DNS door answered without an
  address (`dns.answer`'s NXDOMAIN, REFUSED, SERVFAIL; with capture);
- a `unix.deny`: the sandbox refused a Unix socket (its path is named; one
  whose server runs commands, stages/config/command_sockets.py, is said to
  stay refused, never offered to `[unix] allow`);
- a `conn.fail` of another kind (refused, unreachable, timed out): the
  connection that failed last is named when it is the refusal that came
  last before the exit;
- `program.exit`'s `loopback_refused`: a connection to a port of the
  sandbox's own loopback was refused (nothing listens there) while the
  machine has a listener on that port: a `localhost:PORT` rule reaches it;
- `run.start`'s `files`: the policy's [files] table hid some paths and made
  the rest read-only, which a program meets as "No such file or directory"
  and "Read-only file system". The kernel tells vpnw of no file access it
  refused, so whether the program met a limit cannot be seen: the note comes
  after every run under a table, whatever its exit (not after a stop), and
  trace says the table at the start too (human.py).

A new kind of evidence is one more branch in `note` and one more rule in
`closing_hints`. Of the refusals that come with a place in the run (a Unix
socket, a name, a failed connection, a denial), the one that came last
before the exit is the one a hint says the program "exited after"; the
others are said to have come earlier.
"""
from __future__ import annotations

from stages.config.command_sockets import command_server
from stages.startup.records import Factory, Record
from stages.record.text import printable

CLIENTS = "see \"Clients\" in vpnw's README for what vpnw sets for each client"
_NAMES_SHOWN = 3
_PATHS_SHOWN = 4


# Signals by which a person or the system stops a program (Ctrl-C, Ctrl-\,
# `kill`, a closed terminal, the OOM killer): its end is theirs, not the
# program's, so nothing it met before is why it ended.
_STOPPED_BY = {1, 2, 3, 9, 15}          # SIGHUP, SIGINT, SIGQUIT, SIGKILL, SIGTERM
_NOT_RESOLVED = frozenset({"NXDOMAIN", "REFUSED", "SERVFAIL"})   # the DNS door's answers without an address
_CTRL_C_EXIT = 130                      # what a program that handles SIGINT exits with, as a shell does


class RunFacts(Record):     # not a dataclass: made as the recorder starts, ~1 ms less
    """What the hints are drawn from, gathered event by event."""
    exit_code: int | None = None
    program_ran: bool = False                          # a program.exit came
    stopped: bool = False                              # a person or the system stopped it
    program_code: int | None = None                    # program.exit's code
    no_route: int = 0
    loopback_refused: list = Factory(list)             # ports, from program.exit
    unresolved: list = Factory(list)                 # names, each once, in order
    unix_refused: list = Factory(list)               # socket paths, each once, in order
    failed: tuple | None = None                        # the last failed connection: (host, port, reason)
    last_refusal: str | None = None                    # "unix", "dns", "fail" or "deny": the latest before the exit
    files: dict | None = None                          # run.start's "files"
    policy_file: str | None = None
    captured: bool = False                             # run.start's "capture"
    _hosts: dict = Factory(dict)                       # conn -> host while it is in flight

    def note(self, event: dict) -> None:
        type_ = event.get("type")
        f = event.get("fields") or {}
        conn = event.get("conn")
        if type_ == "conn.request":
            self._hosts[conn] = (f.get("host"), f.get("port"))
        elif type_ in ("conn.open", "conn.fail") or (type_ == "policy.deny"
                                                      and f.get("enforced", True) is not False):
            host, port = self._hosts.pop(conn, None) or (None, None)
            if type_ == "policy.deny":
                self.last_refusal = "deny"
            elif type_ == "conn.fail" and f.get("error") == "dns" and host:
                self.last_refusal = "dns"
                if host not in self.unresolved:
                    self.unresolved.append(host)
            elif type_ == "conn.fail" and host and f.get("stage") != "handshake":
                self.last_refusal = "fail"
                self.failed = (host, port, f.get("reason"))
        elif type_ == "dns.answer" and f.get("rcode") in _NOT_RESOLVED:
            # A name the program looked up itself (capture's DNS door), not
            # only one asked of a door.
            name = f.get("name")
            if isinstance(name, str) and name:
                self.last_refusal = "dns"
                if name not in self.unresolved:
                    self.unresolved.append(name)
        elif type_ == "unix.deny":
            path = f.get("path")
            if isinstance(path, str):
                self.last_refusal = "unix"
                if path in self.unix_refused:      # the latest last: it is the one named first
                    self.unix_refused.remove(path)
                self.unix_refused.append(path)
        elif type_ == "run.start":
            self.files = f.get("files") if isinstance(f.get("files"), dict) else None
            self.policy_file = f.get("policy_file")
            self.captured = f.get("capture") is True
        elif type_ == "program.exit":
            self.program_ran = True
            signal, code = f.get("signal"), f.get("code")
            self.program_code = code
            self.stopped = signal in _STOPPED_BY or code == _CTRL_C_EXIT
            no_route = f.get("no_route")
            self.no_route = no_route if isinstance(no_route, int) else 0
            ports = f.get("loopback_refused")
            self.loopback_refused = [p for p in ports if type(p) is int] if isinstance(ports, list) else []
        elif type_ == "run.end":
            self.exit_code = f.get("exit_code")


def closing_hints(facts: RunFacts) -> list[str]:
    """The hint lines (without "vpnw: ") for a run that ended as `facts` say."""
    if not facts.program_ran or facts.stopped:
        return []
    if not facts.exit_code:
        return [_files_hint(facts)] if facts.files is not None else []
    hints = []
    if facts.no_route:
        tries = "1 try" if facts.no_route == 1 else f"{facts.no_route} tries"
        capture = "" if facts.captured else (
            "; run it with --capture to send such connections through vpnw's doors, "
            "where the policy decides them")
        hints.append(f"hint: the program exited {facts.exit_code} after {tries} at a way out other "
                     f"than vpnw's doors, which the sandbox refused; it may ignore the proxy "
                     f"settings ({CLIENTS}){capture}")
    if facts.loopback_refused:
        hints.append(_loopback_hint(facts))
    # The refusal that came last before the exit is named first.
    placed = []
    if facts.unresolved:
        names = ", ".join(printable(n) for n in facts.unresolved[:_NAMES_SHOWN])
        more = len(facts.unresolved) - _NAMES_SHOWN
        names += f" and {more} more" if more > 0 else ""
        placed.append(("dns", f"hint: {_after(facts, 'dns')}these names could not be resolved on "
                              f"the run's path: {names} (check the spelling, or that the path's "
                              f"DNS knows them)"))
    if facts.unix_refused:
        placed += [("unix", text) for text in _unix_hints(facts)]
    # Only on the program's own exit: under vpnw's 120 the denial is the news.
    if facts.failed is not None and facts.last_refusal == "fail" \
            and facts.exit_code == facts.program_code:
        host, port, reason = facts.failed
        where = printable(f"{host}:{port}" if port is not None else str(host))
        why = f": {printable(reason)}" if isinstance(reason, str) and reason else ""
        placed.append(("fail", f"hint: the program exited {facts.exit_code} after its connection "
                               f"to {where} failed{why}"))
    placed.sort(key=lambda kind_text: kind_text[0] != facts.last_refusal)
    hints += [text for _kind, text in placed]
    if facts.files is not None:
        hints.append(_files_hint(facts))
    return hints


def _after(facts: RunFacts, kind: str) -> str:
    """How a hint about evidence of `kind` begins: "the program exited N; "
    when that evidence came last before the exit, else "earlier, "."""
    if facts.last_refusal in (None, kind):
        return f"the program exited {facts.exit_code}; "
    return "earlier, "


def _unix_hints(facts: RunFacts) -> list[str]:
    """The refused sockets, the latest first: whose servers run commands
    (never offered to [unix] allow), then the others."""
    latest = facts.unix_refused[::-1]
    last_was_unix = facts.last_refusal == "unix"
    commands = [(p, command_server(p)) for p in latest if command_server(p)]
    others = [p for p in latest if not command_server(p)]
    hints = []
    for n, (path, what) in enumerate(commands[:_NAMES_SHOWN]):
        when = (f"the program exited {facts.exit_code} after the sandbox refused it"
                if last_was_unix and n == 0 and path == latest[0] else "the sandbox refused the program")
        hints.append(f"note: {when} the Unix socket {printable(path)}: {what}, which runs commands "
                     f"outside the sandbox for whoever connects, so it stays refused (never name it "
                     f"in [unix] allow)")
    if others:
        paths = _paths(others[:_NAMES_SHOWN], len(others) > _NAMES_SHOWN)
        when = (f"the program exited {facts.exit_code} after the sandbox refused it"
                if last_was_unix and others[0] == latest[0] else "earlier, the sandbox refused the program")
        hints.append(f"hint: {when} the Unix socket {paths} (the policy's [unix] allow can name it)")
    return hints


def _loopback_hint(facts: RunFacts) -> str:
    ports = facts.loopback_refused[:_NAMES_SHOWN]
    rules = ", ".join(f'"localhost:{p}"' for p in ports)
    which = f"port {ports[0]}" if len(ports) == 1 else "ports " + ", ".join(str(p) for p in ports)
    return (f"hint: the program exited {facts.exit_code} after a connection to {which} of the "
            f"sandbox's own loopback was refused: nothing listens there inside the sandbox, but "
            f"this machine has a listener on {'it' if len(ports) == 1 else 'them'}; to let the "
            f"program reach {'it' if len(ports) == 1 else 'them'}, add allow = [{rules}] to the policy")


def _paths(paths, unlisted: bool) -> str:
    paths = [printable(p) for p in paths or []]
    text = ", ".join(paths[:_PATHS_SHOWN])
    if len(paths) > _PATHS_SHOWN or unlisted:
        text += " and more"
    return text


def files_limits(files: dict) -> str:
    """What a [files] table does, as run.start's `files` says: "hid X (...)
    and made everything read-only but Y (...)"."""
    unlisted = bool(files.get("unlisted"))
    parts = []
    hidden = list(files.get("deny_read") or []) + list(files.get("deny_read_absent") or [])
    if hidden:
        parts.append(f"hid {_paths(hidden, unlisted)} (\"No such file or directory\")")
    if files.get("allow_write") is not None:
        writable = _paths(files["allow_write"], unlisted) or "nothing"
        parts.append(f"made everything read-only but {writable} (\"Read-only file system\")")
    return ' and '.join(parts) or 'limits files'


def _files_hint(facts: RunFacts) -> str:
    where = printable(facts.policy_file) if facts.policy_file else "the policy"
    ended = f"exited {facts.exit_code}" if facts.exit_code else "ran"
    return f"note: the program {ended} under the [files] table of {where}, which {files_limits(facts.files)}"

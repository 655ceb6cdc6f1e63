"""Human lines: one event in, at most one line of text out (pure; no I/O).

The layout is the one in docs/architecture.md:

    vpnw 14:44:36.244  #1   → api.github.com:443  http-connect
    vpnw 14:44:36.245  #1     open  140.82.112.6 via direct  (0 ms)
    vpnw 14:44:36.387  #5     DENY   evil.example:443  no allow rule matches ...

The conn column is `#N` left-aligned in five characters; routine steps are a
lower-case word and two spaces, alarms (DENY, WOULD DENY, FAIL) an upper-case
word and three spaces, so they stand out even without colour. Run-level lines
(run, path, sandbox, program) have no conn column.

Every string that came from the event is made printable first: host names come
from the sandboxed program, and a name carrying terminal escape sequences must
not reach the user's terminal.
"""
from __future__ import annotations

import os
import time

from stages.startup.records import Factory, Record
from stages.config.command_sockets import command_server
from stages.recorder.hints import RunFacts, closing_hints, files_limits
from stages.record.text import human_bytes, printable  # noqa: F401 - shared with the learner (stages/record/text.py)

TYPE_CHECKING = False   # typing for the annotations only: its import (~4 ms) stays off the start
if TYPE_CHECKING:
    from typing import Callable, Iterable, Iterator

TRACE = "trace"
RUN = "run"
DENIALS = "denials"   # --quiet: only denials and the summary
QUIET = "quiet"
HUMAN_MODES = (TRACE, RUN, DENIALS, QUIET)

_RED = "\x1b[31m"
_GREEN = "\x1b[32m"
_YELLOW = "\x1b[33m"
_RESET = "\x1b[0m"

class HumanState(Record):     # not a dataclass: made as the recorder starts, ~1 ms less
    """What the formatter remembers between events.

    `conns` maps a connection number to its "host:port" while it is in flight
    (bounded by the number of open connections); `record` is the run file to
    name in the summary (None: take it from run.start). `errors_said`: vpnw
    itself says the run's error on this same stream (a live run whose human
    lines go to its stderr), so neither the summary nor the path check's
    line repeats it: one fact, said once.
    """
    mode: str = TRACE
    color: bool = False
    record: str | None = None
    localtime: Callable[[float], time.struct_time] = time.localtime
    conns: dict = Factory(dict)
    run: str | None = None
    start_record: str | None = None  # the record named in run.start
    facts: RunFacts | None = None    # set: the closing hints follow the summary (stages/recorder/hints.py)
    digest: str | None = None        # the run's last digest, once run.end is sealed
    errors_said: bool = False
    down_said: str | None = None     # the reason a path's DOWN line gave (the summary points at it)
    _second_key: str = ""
    _second_text: str = ""


def host_port(host, port) -> str:
    host = printable(host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def human_ms(ms) -> str:
    if not isinstance(ms, (int, float)) or isinstance(ms, bool):
        return "? ms"
    if ms >= 10_000:
        return f"{ms / 1000:.1f} s"
    return f"{int(round(ms))} ms"


def clock(ts: str, state: HumanState) -> str:
    """RFC 3339 UTC timestamp -> local HH:MM:SS.mmm (cached per second)."""
    second, _, frac = ts.partition(".")
    if second != state._second_key:
        import calendar    # here: a run that prints no timed line never needs it (its start-up)
        try:
            secs = calendar.timegm(time.strptime(second.rstrip("Z"), "%Y-%m-%dT%H:%M:%S"))
            state._second_text = time.strftime("%H:%M:%S", state.localtime(secs))
        except (ValueError, OverflowError):
            state._second_text = "??:??:??"
        state._second_key = second
    millis = (frac.rstrip("Z") + "000")[:3] if frac else "000"
    return f"{state._second_text}.{millis}"


def _paint(word: str, colour: str, state: HumanState) -> str:
    return f"{colour}{word}{_RESET}" if state.color else word


def _conn_col(conn) -> str:
    return f"#{conn}".ljust(5)


def summary_text(event: dict, state: HumanState) -> str:
    f = event.get("fields", {})
    parts = [f"{f.get('connections', 0)} connections", f"{f.get('denied', 0)} denied"]
    if f.get("would_deny"):
        parts.append(f"{f.get('would_deny')} would be denied")
    parts.append(f"{f.get('failed', 0)} failed")
    text = f"run {printable(event.get('run', '?'))}: {', '.join(parts)}; exit {f.get('exit_code', '?')}"
    if f.get("error") and not state.errors_said:
        error = str(f["error"])
        if state.down_said and f": {state.down_said}" in error:
            # `show`: the path's DOWN line above gave the reason; say it once.
            error = error.replace(f": {state.down_said}", " (why: on its DOWN line above)", 1)
        text += f"; error: {printable(error)}"
    if f.get("events_to_lost"):
        text += f"; --events-to copy lost {printable(f['events_to_lost'])} events (the record has them all)"
    record = state.record
    if record is None:
        record = state.start_record
    if record == "-":
        text += "; record on stdout"
    elif record:
        home = os.path.expanduser("~")
        shown = "~" + record[len(home):] if home not in ("", "/") and record.startswith(home + "/") else record
        text += f"; record {printable(shown)}"
    if state.digest:
        text += f"; last digest {printable(state.digest)}"
    return text


def _scope_note(event: dict, f: dict, head) -> str | None:
    """Said once, at the start: what deny_private cannot cover on this path."""
    if f.get("deny_private_scope") != "literals-and-names":
        return None
    via = printable(f.get("via") or event.get("path") or "?")
    return (f"{head()}note: path {via} resolves names at the exit, so deny_private covers "
            "address literals and special names (localhost, .internal, ...) only: vpnw never "
            "sees the addresses other names resolve to there")


def _command_socket_note(f: dict, head) -> str | None:
    """Said once, at the start: a [unix] allow entry that names a socket
    whose server runs commands outside the sandbox (tmux, Docker, D-Bus...):
    allowed as the policy says, and said, since it hands the program the
    machine (docs/security.md, "Unix sockets by origin")."""
    named = []
    for item in f.get("unix_allow") or []:
        if not isinstance(item, dict):
            continue
        for address in (item.get("path"), item.get("entry")):
            what = command_server(address) if isinstance(address, str) else None
            if what:
                named.append(f"{printable(item.get('entry') or address)} ({what})")
                break
    if not named:
        return None
    return (f"{head()}note: [unix] allow names {', '.join(named)}, which runs commands outside "
            "the sandbox for whoever connects: the program can do through it what you can")


def _shadows_note(f: dict, head) -> str | None:
    """Said once, at the start: the allow rules deny_private refuses anyway."""
    shadows = f.get("deny_private_shadows")
    if not isinstance(shadows, dict):
        return None
    rules = [printable(r) for r in shadows.get("rules") or [] if isinstance(r, str)]
    if shadows.get("unlisted"):
        rules.append(f"{printable(shadows['unlisted'])} more")
    which = "allow rule" if len(rules) == 1 else "allow rules"
    return (f"{head()}note: deny_private = true ({printable(shadows.get('set', '?'))}) comes first "
            f"and refuses what {which} {', '.join(rules)} allow; set deny_private = false to "
            "let them through")


def format_event(event: dict, state: HumanState) -> str | None:
    """The human line for one event, or None when the mode shows nothing for it."""
    type_ = event.get("type")
    if state.facts is not None:
        state.facts.note(event)
    if state.mode == QUIET:
        return None
    if state.mode == DENIALS and type_ not in _SHOWN_WITH_DENIALS:
        return None
    formatter = _FORMATTERS.get(type_)
    if formatter is None:
        return None
    return formatter(_HumanLine(event, state))


_SHOWN_WITH_DENIALS = frozenset({"policy.deny", "run.end", "run.start", "conn.request",
                                 "conn.fail", "conn.close", "unix.deny"})


class _HumanLine:
    """One event on its way to a line: its parts and the state they update."""
    __slots__ = ("event", "f", "conn", "state", "trace")

    def __init__(self, event: dict, state: HumanState):
        self.event = event
        self.f = event.get("fields") or {}
        self.conn = event.get("conn")
        self.state = state
        self.trace = state.mode == TRACE

    def head(self) -> str:
        # Only for lines that are printed: the run mode skips most events.
        return f"vpnw {clock(str(self.event.get('ts', '')), self.state)}  "

    def conn_head(self) -> str:
        return self.head() + _conn_col(self.conn)


def _conn_request(x: _HumanLine) -> str | None:
    target = host_port(x.f.get("host", "?"), x.f.get("port", "?"))
    x.state.conns[x.conn] = target
    if not x.trace:
        return None
    fake = f"  (DNS door's {printable(x.f['fake_address'])})" if x.f.get("fake_address") else ""
    return f"{x.conn_head()}→ {target}  {printable(x.f.get('kind', '?'))}{fake}"


def _dns_resolve(x: _HumanLine) -> str | None:
    if not x.trace:
        return None
    f = x.f
    host = printable(f.get("host", "?"))
    if f.get("error"):
        return f"{x.conn_head()}  dns  {host}: {printable(f['error'])}  ({human_ms(f.get('ms'))})"
    addresses = ", ".join(printable(a) for a in (f.get("addresses") or [])) or "no addresses"
    return f"{x.conn_head()}  dns  {host} → {addresses}  ({human_ms(f.get('ms'))})"


def _dns_answer(x: _HumanLine) -> str | None:
    # The DNS door (capture): trace shows each answer; nothing was looked up.
    if not x.trace:
        return None
    f = x.f
    given = printable(f["address"]) if f.get("address") else printable(f.get("rcode", "?"))
    why = f"  {printable(f['reason'])}" if f.get("reason") else ""
    return (f"{x.head()}{'':5}  dns door  {printable(f.get('name', '?'))} "
            f"{printable(f.get('type', '?'))} → {given}{why}")


def _policy_allow(x: _HumanLine) -> None:
    # The open (or FAIL) line that follows says the same thing more usefully.
    return None


def _policy_deny(x: _HumanLine) -> str:
    target = x.state.conns.get(x.conn, "?")
    if x.f.get("enforced", True) is not False:
        x.state.conns.pop(x.conn, None)
        word = _paint("DENY", _RED, x.state)
    else:
        word = _paint("WOULD DENY", _RED, x.state)
    return f"{x.conn_head()}  {word}   {target}  {printable(x.f.get('reason', ''))}"


def _conn_open(x: _HumanLine) -> str | None:
    if not x.trace:
        return None
    return (f"{x.conn_head()}  {_paint('open', _GREEN, x.state)}  "
            f"{printable(x.f.get('address', '?'))} via {printable(x.f.get('via', '?'))}  "
            f"({human_ms(x.f.get('ms'))})")


def _conn_fail(x: _HumanLine) -> str | None:
    target = x.state.conns.pop(x.conn, None) or "?"
    if x.state.mode == DENIALS:
        return None
    return (f"{x.conn_head()}  {_paint('FAIL', _YELLOW, x.state)}   {target}  "
            f"{printable(x.f.get('reason') or x.f.get('error') or '')}")


def _conn_close(x: _HumanLine) -> str | None:
    x.state.conns.pop(x.conn, None)
    if not x.trace:
        return None
    return (f"{x.conn_head()}  close  ↑{human_bytes(x.f.get('bytes_up'))} "
            f"↓{human_bytes(x.f.get('bytes_down'))}  ({human_ms(x.f.get('ms'))})")


def _run_start(x: _HumanLine) -> str | None:
    event, f, state = x.event, x.f, x.state
    state.run = event.get("run")
    state.start_record = f.get("record")
    # --quiet shows denials and the summary only (the README's promise): the
    # start's notes are for the other modes.
    note = None if state.mode == DENIALS else (
        "\n".join(n for n in (_scope_note(event, f, x.head), _shadows_note(f, x.head),
                              _command_socket_note(f, x.head)) if n) or None)
    if not x.trace:
        return note
    extras = [f"via {printable(f.get('via') or event.get('path') or 'direct')}"]
    if f.get("policy") or f.get("policy_file"):
        extras.append(f"policy {printable(f.get('policy') or f.get('policy_file'))}")
    if f.get("dry_run"):
        extras.append("dry run")
    if f.get("allow_unix_sockets"):
        extras.append("unix sockets allowed")
    if f.get("env_kept"):
        kept = f["env_kept"] if isinstance(f["env_kept"], list) else []
        extras.append("kept your " + " ".join(printable(name) for name in kept[:8]))
    line = (f"{x.head()}run {printable(event.get('run', '?'))}: {printable(f.get('mode', '?'))} "
            f"{printable(f.get('program', '?'))}  ({', '.join(extras)})")
    if isinstance(f.get("files"), dict):
        # Said before the program meets it: the table's limits look like the
        # program's own errors ("No such file", "Read-only file system").
        where = printable(f.get("policy_file") or "the policy")
        line += f"\n{x.head()}files: the [files] table of {where} {files_limits(f['files'])}"
    return f"{line}\n{note}" if note else line


def _path_check(x: _HumanLine) -> str | None:
    name = printable(x.f.get("path", "?"))
    if x.f.get("ok"):
        if not x.trace:
            return None
        return f"{x.head()}path {name} ok  ({printable(x.f.get('type', '?'))}, {human_ms(x.f.get('ms'))})"
    down = _paint("DOWN", _RED, x.state)
    if x.state.errors_said:
        # vpnw says why in its own message right after: the trace keeps the step.
        return f"{x.head()}path {name} {down}  ({human_ms(x.f.get('ms'))})" if x.trace else None
    x.state.down_said = str(x.f.get("error", "unreachable"))
    return f"{x.head()}path {name} {down}: {printable(x.state.down_said)}"


def _sandbox_ready(x: _HumanLine) -> str | None:
    if not x.trace:
        return None
    f = x.f
    namespaces = " ".join(printable(n) for n in (f.get("namespaces") or [])) or "none"
    doors = f.get("doors") or {}
    door_text = ", ".join(f"{printable(k)} {printable(v)}" for k, v in sorted(doors.items()))
    unix = {"own": "own unix sockets", "all": "unix sockets ALLOWED"}.get(
        f.get("unix"), "unix sockets ALLOWED" if f.get("unix_sockets") else "no unix sockets")
    seccomp = "seccomp on" if f.get("seccomp") else "seccomp OFF"
    local = f.get("local_doors") or []
    local_text = f"; the machine's loopback on {', '.join(printable(p) for p in local)}" if local else ""
    return f"{x.head()}sandbox ready: {namespaces}; {seccomp}; {unix}; doors {door_text}{local_text}"


def _program_exit(x: _HumanLine) -> str | None:
    if not x.trace:
        return None
    if x.f.get("signal"):
        return f"{x.head()}program killed by signal {printable(x.f['signal'])}"
    return f"{x.head()}program exited with code {printable(x.f.get('code'))}"


def _unix(x: _HumanLine) -> str | None:
    """A Unix socket the supervisor refused (shown as a denial is), or one the
    policy names (trace only, as an opened connection is)."""
    f = x.f
    who = f"({printable(f.get('program') or '?')} pid {printable(f.get('process', '?'))})"
    path = printable(f.get("path", "?"))
    if x.event.get("type") == "unix.deny":
        return (f"{x.head()}unix  {_paint('DENY', _RED, x.state)}   {path}  "
                f"{printable(f.get('reason', ''))}  {who}")
    if not x.trace:
        return None
    return f"{x.head()}unix  → {path}  allowed by [unix] {printable(f.get('rule', '?'))}  {who}"


def _run_end(x: _HumanLine) -> str:
    line = ("vpnw  " if x.state.mode in (RUN, DENIALS) else x.head()) + summary_text(x.event, x.state)
    if x.state.facts is None or x.state.mode == DENIALS:    # --quiet: denials and the summary only
        return line
    return "\n".join([line, *(f"vpnw: {hint}" for hint in closing_hints(x.state.facts))])


# Event type -> its line (None: the mode shows nothing for it). A new event
# type gets a function here, or prints nothing.
_FORMATTERS = {
    "conn.request": _conn_request, "dns.resolve": _dns_resolve, "dns.answer": _dns_answer,
    "policy.allow": _policy_allow,
    "policy.deny": _policy_deny, "conn.open": _conn_open, "conn.fail": _conn_fail,
    "conn.close": _conn_close, "run.start": _run_start, "path.check": _path_check,
    "sandbox.ready": _sandbox_ready, "program.exit": _program_exit, "run.end": _run_end,
    "unix.deny": _unix, "unix.allow": _unix,
}


class LiveOrder:
    """The live human lines in the order things happened, as `show` prints
    them (docs/record.md "Order"): the orchestrator's program.exit can reach
    the recorder before the broker's last events of a short program, whose
    `ts` is earlier. Its line waits until an event that happened at or after
    it arrives, or run.end, or the end of the stream (`flush`); anything
    earlier that arrives meanwhile goes first. The record keeps arrival order;
    only this line waits, and never longer than the broker's last events."""

    def __init__(self):
        self.held: dict | None = None

    def feed(self, event: dict) -> list[dict]:
        """The events to print now, in order."""
        held = self.held
        if event.get("type") == "program.exit":
            self.held = event
            return [held] if held is not None else []
        if held is None:
            return [event]
        if event.get("type") != "run.end" and _ts(event) < _ts(held):
            return [event]
        self.held = None
        return [held, event]

    def flush(self) -> list[dict]:
        held, self.held = self.held, None
        return [held] if held is not None else []


def _ts(event: dict) -> str:
    ts = event.get("ts")
    return ts if isinstance(ts, str) else ""


def human_lines(events: Iterable[dict], record: str | None = None) -> Iterator[str]:
    """A recorded run's human lines, as `vpnw trace` printed them."""
    state = HumanState(mode=TRACE, record=record)
    for event in events:
        if event.get("type") == "run.end" and isinstance(event.get("d"), str):
            state.digest = event["d"]      # as the live summary named it
        text = format_event(event, state)
        if text is not None:
            yield text



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

import calendar
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from stages.record.text import human_bytes, printable  # noqa: F401 - shared with the learner (stages/record/text.py)

TRACE = "trace"
RUN = "run"
DENIALS = "denials"   # --quiet: only denials and the summary
QUIET = "quiet"
HUMAN_MODES = (TRACE, RUN, DENIALS, QUIET)

_RED = "\x1b[31m"
_GREEN = "\x1b[32m"
_YELLOW = "\x1b[33m"
_RESET = "\x1b[0m"

@dataclass
class HumanState:
    """What the formatter remembers between events.

    `conns` maps a connection number to its "host:port" while it is in flight
    (bounded by the number of open connections); `record` is the run file to
    name in the summary (None: take it from run.start).
    """
    mode: str = TRACE
    color: bool = False
    record: str | None = None
    localtime: Callable[[float], time.struct_time] = time.localtime
    conns: dict = field(default_factory=dict)
    run: str | None = None
    start_record: str | None = None  # the record named in run.start
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
    if f.get("error"):
        text += f"; error: {printable(f['error'])}"
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
    return text


def _scope_note(event: dict, f: dict, head) -> str | None:
    """Said once, at the start: what deny_private cannot cover on this path."""
    if f.get("deny_private_scope") != "literals-and-names":
        return None
    via = printable(f.get("via") or event.get("path") or "?")
    return (f"{head()}note: path {via} resolves names at the exit, so deny_private covers "
            "address literals and special names (localhost, .internal, ...) only: vpnw never "
            "sees the addresses other names resolve to there")


def _unix_line(type_: str, f: dict, mode: str, state: HumanState, head) -> str | None:
    """A Unix socket the supervisor refused (shown as a denial is), or one the
    policy names (trace only, as an opened connection is)."""
    who = f"({printable(f.get('program') or '?')} pid {printable(f.get('process', '?'))})"
    path = printable(f.get("path", "?"))
    if type_ == "unix.deny":
        return (f"{head()}unix  {_paint('DENY', _RED, state)}   {path}  "
                f"{printable(f.get('reason', ''))}  {who}")
    if mode != TRACE:
        return None
    return f"{head()}unix  → {path}  allowed by [unix] {printable(f.get('rule', '?'))}  {who}"


def format_event(event: dict, state: HumanState) -> str | None:
    """The human line for one event, or None when the mode shows nothing for it."""
    type_ = event.get("type")
    f = event.get("fields") or {}
    conn = event.get("conn")
    mode = state.mode
    if mode == QUIET:
        return None
    if mode == DENIALS and type_ not in ("policy.deny", "run.end", "run.start", "conn.request",
                                         "conn.fail", "conn.close", "unix.deny"):
        return None

    def head() -> str:
        # Only for lines that are printed: the run mode skips most events.
        return f"vpnw {clock(str(event.get('ts', '')), state)}  "

    if type_ == "conn.request":
        target = host_port(f.get("host", "?"), f.get("port", "?"))
        state.conns[conn] = target
        if mode != TRACE:
            return None
        return f"{head()}{_conn_col(conn)}→ {target}  {printable(f.get('kind', '?'))}"

    if type_ == "dns.resolve":
        if mode != TRACE:
            return None
        host = printable(f.get("host", "?"))
        if f.get("error"):
            return f"{head()}{_conn_col(conn)}  dns  {host}: {printable(f['error'])}  ({human_ms(f.get('ms'))})"
        addresses = ", ".join(printable(a) for a in (f.get("addresses") or [])) or "no addresses"
        return f"{head()}{_conn_col(conn)}  dns  {host} → {addresses}  ({human_ms(f.get('ms'))})"

    if type_ == "policy.allow":
        # The open (or FAIL) line that follows says the same thing more usefully.
        return None

    if type_ == "policy.deny":
        target = state.conns.get(conn, "?")
        enforced = f.get("enforced", True) is not False
        if enforced:
            state.conns.pop(conn, None)
            word = _paint("DENY", _RED, state)
        else:
            word = _paint("WOULD DENY", _RED, state)
        return f"{head()}{_conn_col(conn)}  {word}   {target}  {printable(f.get('reason', ''))}"

    if type_ in ("unix.deny", "unix.allow"):
        return _unix_line(type_, f, mode, state, head)

    if type_ == "conn.open":
        if mode != TRACE:
            return None
        return (f"{head()}{_conn_col(conn)}  {_paint('open', _GREEN, state)}  "
                f"{printable(f.get('address', '?'))} via {printable(f.get('via', '?'))}  "
                f"({human_ms(f.get('ms'))})")

    if type_ == "conn.fail":
        target = state.conns.pop(conn, None) or "?"
        if mode == DENIALS:
            return None
        return (f"{head()}{_conn_col(conn)}  {_paint('FAIL', _YELLOW, state)}   {target}  "
                f"{printable(f.get('reason') or f.get('error') or '')}")

    if type_ == "conn.close":
        state.conns.pop(conn, None)
        if mode != TRACE:
            return None
        return (f"{head()}{_conn_col(conn)}  close  ↑{human_bytes(f.get('bytes_up'))} "
                f"↓{human_bytes(f.get('bytes_down'))}  ({human_ms(f.get('ms'))})")

    if type_ == "run.start":
        state.run = event.get("run")
        state.start_record = f.get("record")
        note = _scope_note(event, f, head)
        if mode != TRACE:
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
        line = (f"{head()}run {printable(event.get('run', '?'))}: {printable(f.get('mode', '?'))} "
                f"{printable(f.get('program', '?'))}  ({', '.join(extras)})")
        return f"{line}\n{note}" if note else line

    if type_ == "path.check":
        name = printable(f.get("path", "?"))
        if f.get("ok"):
            if mode != TRACE:
                return None
            return f"{head()}path {name} ok  ({printable(f.get('type', '?'))}, {human_ms(f.get('ms'))})"
        return f"{head()}path {name} {_paint('DOWN', _RED, state)}: {printable(f.get('error', 'unreachable'))}"

    if type_ == "sandbox.ready":
        if mode != TRACE:
            return None
        namespaces = " ".join(printable(n) for n in (f.get("namespaces") or [])) or "none"
        doors = f.get("doors") or {}
        door_text = ", ".join(f"{printable(k)} {printable(v)}" for k, v in sorted(doors.items()))
        unix = {"own": "own unix sockets", "all": "unix sockets ALLOWED"}.get(
            f.get("unix"), "unix sockets ALLOWED" if f.get("unix_sockets") else "no unix sockets")
        seccomp = "seccomp on" if f.get("seccomp") else "seccomp OFF"
        return f"{head()}sandbox ready: {namespaces}; {seccomp}; {unix}; doors {door_text}"

    if type_ == "program.exit":
        if mode != TRACE:
            return None
        if f.get("signal"):
            return f"{head()}program killed by signal {printable(f['signal'])}"
        return f"{head()}program exited with code {printable(f.get('code'))}"

    if type_ == "run.end":
        if mode in (RUN, DENIALS):
            return "vpnw  " + summary_text(event, state)
        return head() + summary_text(event, state)

    return None


def human_lines(events: Iterable[dict], record: str | None = None) -> Iterator[str]:
    """A recorded run's human lines, as `vpnw trace` printed them."""
    state = HumanState(mode=TRACE, record=record)
    for event in events:
        text = format_event(event, state)
        if text is not None:
            yield text



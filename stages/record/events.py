"""The record, version 1: the one place that says what an event is.

Every stage that writes events constructs its kind's type (event_types.py)
and hands it to an `Emitter`; every stage that reads them uses `read_events`
(and event_types.decode for a kind's type). The human-readable description
is docs/record.md and the machine-readable one is schema.json beside this
file; tests check that they and the types agree.
"""
from __future__ import annotations

import os
import time

from stages.startup.imports import import_orjson


orjson = import_orjson()

from stages.record.run_file import (  # noqa: F401  (the record's names, here as before)
    RUN_ID_BYTES, RecordUnwritable, new_run_id, open_run_file, state_dir, vpnw_state_dir,
)

TYPE_CHECKING = False   # typing for the annotations only: its import (~4 ms) stays off the start
if TYPE_CHECKING:
    from typing import IO, Iterator

VERSION = 1

# The event types, in the order a run produces them.
EVENT_TYPES = (
    "run.start",      # orchestrator: the run begins
    "path.check",     # broker: the chosen path was checked before the program starts
    "sandbox.ready",  # orchestrator: the helper sealed the sandbox; what the seal holds
    "conn.request",   # broker: a client asked a door for host:port
    "dns.resolve",    # broker: a name was looked up (only when an address could change the answer)
    "dns.answer",     # broker: the DNS door answered a query (capture); nothing was looked up
    "policy.allow",   # broker: the policy allowed the request
    "policy.deny",    # broker: the policy denied it (or would have, under --dry-run)
    "conn.open",      # broker: the destination was dialled and the relay started
    "conn.fail",      # broker: the connection could not be made (or the handshake was bad)
    "conn.close",     # broker: an opened connection ended; byte counts and duration
    "unix.allow",     # orchestrator: the supervisor connected a Unix socket the policy names
    "unix.deny",      # orchestrator: the supervisor refused a Unix socket bound outside
    "program.exit",   # orchestrator: the program ended (code or signal)
    "files.held",     # orchestrator: what the program wrote outside its work set (held, not applied)
    "run.end",        # orchestrator: the run is over; totals and vpnw's exit code
)                     # (the recorder adds events_to_lost: what the --events-to copy dropped)


# run.start's deny_private_scope: what deny_private covers on the run's path.
# "addresses": every address vpnw dials (it resolves names itself);
# "literals-and-names": a path that resolves names at the exit, where vpnw
# sees only address literals and refuses special names by name.
DENY_PRIVATE_SCOPES = ("addresses", "literals-and-names")

# Lines stay below PIPE_BUF so that several writers can share one pipe and a
# line is never torn: a write of at most PIPE_BUF bytes to a pipe is atomic.
MAX_LINE = 4000
MAX_FIELD = 512


# The digest chain (docs/record.md, "Tamper evidence"). The recorder, the one
# writer of a run file, ends each line with ,"d":"<hex>"} where
#   d(1) = SHA-256(body(1)),  d(n) = SHA-256(ascii hex d(n-1) + body(n)),
# body(n) being the line's exact bytes without that suffix (the object closed
# by "}" right after its last other member) and without the newline. Computed
# over bytes, never over re-serialised JSON, so any changed byte shows.
DIGEST_KEY_OPEN = b',"d":"'
DIGEST_HEX = 64
DIGEST_SUFFIX_LEN = len(DIGEST_KEY_OPEN) + DIGEST_HEX + 2      # ,"d":"<64 hex>"}


def split_digest(line: bytes) -> tuple[bytes, bytes] | None:
    """A chained line (no newline) -> (body, hex digest), or None when it does
    not end as the recorder ends a chained line."""
    if len(line) <= DIGEST_SUFFIX_LEN or not line.endswith(b'"}'):
        return None
    start = len(line) - DIGEST_SUFFIX_LEN
    if line[start:start + len(DIGEST_KEY_OPEN)] != DIGEST_KEY_OPEN:
        return None
    digest = line[start + len(DIGEST_KEY_OPEN):-2]
    if digest.strip(b"0123456789abcdef"):
        return None
    return line[:start] + b"}", digest


class RecordError(ValueError):
    """A line that is not a valid version-1 event."""


_second = [-1, ""]   # the last whole second formatted, and its text


def rfc3339_ns(ns: int) -> str:
    secs, frac = divmod(ns, 1_000_000_000)
    # A busy broker stamps thousands of events a second: format the date
    # and time once per second, not once per event.
    if secs != _second[0]:
        _second[0], _second[1] = secs, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    return f"{_second[1]}.{frac:09d}Z"


def _needs_clip(fields: dict) -> bool:
    for value in fields.values():
        kind = type(value)
        if (kind is str and len(value) > MAX_FIELD) or kind is list or kind is dict:
            return True
    return False


def _clip(value):
    # Field values come from untrusted clients (host names); keep lines bounded.
    if isinstance(value, str) and len(value) > MAX_FIELD:
        return value[:MAX_FIELD] + "…"
    if isinstance(value, list):
        return [_clip(v) for v in value[:64]]
    if isinstance(value, dict):
        return {k: _clip(v) for k, v in value.items()}
    return value


def encode(run: str, type_: str, fields: dict, *, path: str | None = None,
           conn: int | None = None, pid: int | None = None, ts_ns: int | None = None) -> bytes:
    if type_ not in EVENT_TYPES:
        raise RecordError(f"unknown event type {type_!r}")
    event = {
        "v": VERSION,
        "ts": rfc3339_ns(time.time_ns() if ts_ns is None else ts_ns),
        "type": type_,
        "run": run,
        "pid": os.getpid() if pid is None else pid,
        "path": path,
        "conn": conn,
        "fields": _clip(fields),
    }
    line = orjson.dumps(event) + b"\n"
    if len(line) > MAX_LINE:
        line = _shortened(event) if type_ in LISTS_SHORTENED else None
        if line is None:
            event["fields"] = {"truncated": True}
            line = orjson.dumps(event) + b"\n"
    return line


# Events whose too-long line keeps every field, its longest lists shortened
# and what was left out counted in "cut" (docs/record.md): run.start says
# what the run was, and it is written once.
LISTS_SHORTENED = frozenset({"run.start"})


def _shortened(event: dict) -> bytes | None:
    """The event's line with items dropped from the end of its longest lists
    (top-level fields, or one level down: "files.deny_read"), one at a time,
    until it fits; "cut" says how many went from which list. None when
    emptying every list is not enough."""
    fields = event["fields"]        # _clip's copy: ours to shorten
    cut: dict[str, int] = {}
    while True:
        if cut:
            fields["cut"] = cut
        line = orjson.dumps(event) + b"\n"
        if len(line) <= MAX_LINE:
            return line
        name, longest = _longest_list(fields)
        if longest is None:
            return None
        longest.pop()
        cut[name] = cut.get(name, 0) + 1


def _longest_list(fields: dict) -> tuple[str, list | None]:
    """The non-empty list, among the fields and the fields of dict fields,
    whose JSON is longest ("cut" aside)."""
    best, best_len, name = None, 0, ""
    for key, value in fields.items():
        if key == "cut":
            continue
        inner = value.items() if type(value) is dict else ()
        for path, item in [(key, value), *((f"{key}.{k}", v) for k, v in inner)]:
            if type(item) is list and item:
                size = len(orjson.dumps(item))
                if size > best_len:
                    best, best_len, name = item, size, path
    return name, best


_HEAD = b'{"v":' + str(VERSION).encode() + b',"ts":"'
# This process's pid, kept current across forks (os.getpid is a system call).
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


class Emitter:
    """Writes events to a file descriptor, whole lines only.

    Unbuffered, each event is one write(2). After `hold()`, lines gather until
    `flush()` (or until the next line would pass PIPE_BUF), so a busy broker
    wakes the recorder once per loop turn instead of once per event; every
    write stays at most PIPE_BUF bytes and so is still atomic on the shared pipe.
    """

    PIPE_BUF = 4096

    def __init__(self, fd: int, run: str, path: str | None = None):
        self.fd = fd
        self.run = run
        self.path = path
        self._held: bytearray | None = None
        self._pid = None

    def _encode(self, type_: str, conn, fields: dict) -> bytes:
        """encode()'s bytes, the envelope's fixed members serialised once
        (an emitter writes for one run, one path and, once forked, one pid):
        a busy broker writes four or five events per connection. `type_` is
        a kind of EVENT_TYPES (emit checks it)."""
        pid = _PID[0]
        if pid != self._pid:
            self._pid = pid
            self._after_type = (b'","run":' + orjson.dumps(self.run) + b',"pid":' + str(pid).encode()
                                + b',"path":' + orjson.dumps(self.path) + b',"conn":')
        if type(conn) is not int and conn is not None or _needs_clip(fields):
            return encode(self.run, type_, fields, path=self.path, conn=conn, pid=pid)
        line = b"".join((_HEAD, rfc3339_ns(time.time_ns()).encode(), b'","type":"',
                         type_.encode(), self._after_type, b"null" if conn is None else str(conn).encode(),
                         b',"fields":', orjson.dumps(fields), b"}\n"))
        if len(line) > MAX_LINE:
            return encode(self.run, type_, fields, path=self.path, conn=conn, pid=pid)
        return line

    def _encode_event(self, event) -> bytes:
        """An event_types event's line: _encode's bytes. A flat event (no list
        or object among its fields, as the broker's connection events are)
        whose fields' JSON is at most MAX_FIELD bytes has no field to clip:
        its line is made without looking at each field."""
        fields = event.fields()
        conn = event.conn
        if event._flat and (conn is None or type(conn) is int):
            body = orjson.dumps(fields)
            pid = _PID[0]
            if len(body) <= MAX_FIELD and pid == self._pid:
                line = b"".join((_HEAD, rfc3339_ns(time.time_ns()).encode(), b'","type":"',
                                 event._kind_bytes, self._after_type,
                                 b"null" if conn is None else b"%d" % conn, b',"fields":', body, b"}\n"))
                if len(line) <= MAX_LINE:
                    return line
        return self._encode(event.KIND, conn, fields)     # a type's KIND is a kind

    def emit(self, event) -> None:
        """Write one event, an event_types type (`emit(ConnClose(7, bytes_up=...))`)."""
        line = self._encode_event(event)
        if self._held is None:
            self._write(line)
            return
        if len(self._held) + len(line) > self.PIPE_BUF:
            self.flush()
        self._held += line

    def hold(self) -> None:
        if self._held is None:
            self._held = bytearray()

    def flush(self) -> None:
        if self._held:
            data, self._held = bytes(self._held), bytearray()
            self._write(data)

    def _write(self, data: bytes) -> None:
        try:
            os.write(self.fd, data)
        except BrokenPipeError:
            # The recorder is gone; the orchestrator notices and stops the run.
            pass


def parse_line(line: bytes | str) -> dict:
    """One line of a run file -> an event dict, or RecordError."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise RecordError("an event is a JSON object")
    if event.get("v") != VERSION:
        raise RecordError(f"unsupported record version {event.get('v')!r}")
    if event.get("type") not in EVENT_TYPES:
        raise RecordError(f"unknown event type {event.get('type')!r}")
    if not isinstance(event.get("fields"), dict):
        raise RecordError("fields must be an object")
    if not isinstance(event.get("run"), str) or not isinstance(event.get("ts"), str):
        raise RecordError("run and ts must be strings")
    conn = event.get("conn")
    if conn is not None and (not isinstance(conn, int) or isinstance(conn, bool)):
        raise RecordError("conn must be an integer or null")
    return event


def read_events(stream: IO[bytes], *, strict: bool = False) -> Iterator[dict]:
    """Stream events from a run file. A torn or foreign line is skipped unless
    strict (a run file cut short by a crash still yields everything flushed)."""
    for raw in stream:
        if not raw.strip():
            continue
        try:
            yield parse_line(raw)
        except RecordError:
            if strict:
                raise

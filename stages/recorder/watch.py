"""`vpnw watch [RUN]`: a live view of a run, per destination (docs/record.md
"Watching a run"). It reads the run file as it grows, so it works for a run
in another terminal, and for the last one when it has ended.

Sans-I/O core: `WatchState.feed(event)` takes each event; `frame(state,
width, height)` is pure text. The shell follows the file (complete lines
only: a line being written is read once it ends) and redraws with two ANSI
sequences (home, clear) when something changed, at most a few times a
second; not a terminal: one frame at the end. No curses: a table redrawn
whole is all it needs, and it stays a plain stream a test can read.
"""
from __future__ import annotations

import os
import sys
import textwrap
import time

from stages.record.destinations import Tally
from stages.record.events import RecordError, parse_line
from stages.record.text import human_bytes, printable

REDRAW_EVERY = 0.25          # seconds: at most four frames a second
READ_SIZE = 1 << 16
CLEAR = "\x1b[H\x1b[2J"


class WatchState:
    """What the view shows, event by event: the run's header and the
    destinations' totals (record/destinations.py's Tally, shared with
    `vpnw show --summary`), each with the last reason it was refused or
    failed for and the connections open now."""

    def __init__(self):
        self.tally = Tally()
        self.start: dict = {}
        self.end: dict | None = None
        self.run: str | None = None
        self.last_reason: dict[tuple, str] = {}     # (host, port) -> the last deny or fail reason
        self.order: dict[tuple, int] = {}           # (host, port) -> when it was last active
        self.open_now: dict[tuple, int] = {}        # (host, port) -> connections relaying now
        self._conns: dict = {}                      # conn -> (host, port)
        self._relaying: set = set()
        self._seen = 0
        self.last_refusal: str | None = None        # the newest denial or failure, in full

    def feed(self, event: dict) -> None:
        self.tally.feed(event)
        type_, f, conn = event.get("type"), event.get("fields") or {}, event.get("conn")
        self.run = self.run or event.get("run")
        if type_ == "run.start":
            self.start = f
        elif type_ == "run.end":
            self.end = f
        elif type_ == "conn.request":
            key = (f.get("host"), f.get("port"))
            self._conns[conn] = key
            self._touch(key)
        elif conn in self._conns:
            key = self._conns[conn]
            self._touch(key)
            if type_ == "policy.deny" and f.get("enforced", True) is not False:
                self.last_reason[key] = f"denied: {f.get('reason', '')}"
                self.last_refusal = f"{_target(*key)} {self.last_reason[key]}"
                self._conns.pop(conn, None)
            elif type_ == "conn.fail":
                self.last_reason[key] = f"failed: {f.get('reason') or f.get('error') or ''}"
                self.last_refusal = f"{_target(*key)} {self.last_reason[key]}"
                self._conns.pop(conn, None)
            elif type_ == "conn.open":
                self.open_now[key] = self.open_now.get(key, 0) + 1
                self._relaying.add(conn)
            elif type_ == "conn.close":
                if conn in self._relaying:
                    self._relaying.discard(conn)
                    self.open_now[key] = max(0, self.open_now.get(key, 0) - 1)
                self._conns.pop(conn, None)

    def _touch(self, key) -> None:
        self._seen += 1
        self.order[key] = self._seen


def _target(host, port) -> str:
    host = printable(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


FOOTER_LINES = 3


def _wrapped(text: str, width: int, most: int) -> list[str]:
    lines = textwrap.wrap(text, max(20, width), break_long_words=True) or [""]
    if len(lines) > most:
        lines = lines[:most]
        lines[-1] = _cut(lines[-1] + " …", width)
    return lines


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def frame(state: WatchState, width: int = 100, height: int = 40) -> list[str]:
    """The view as lines, at most `height`, none wider than `width`."""
    s = state.start
    program = printable(s.get("program") or "?")
    mode = printable(s.get("mode") or "?")
    policy = printable(s.get("policy_file") or "no policy")
    if state.end is None:
        status = "running"
    else:
        status = f"ended, exit {state.end.get('exit_code')}"
    dests = list(state.tally.table.values())
    totals = (sum(d.opened - d.would_deny for d in dests), sum(d.denied for d in dests),
              sum(d.failed for d in dests))
    lines = [_cut(f"vpnw watch  {printable(state.run or '?')}  {mode} {program}  {policy}  via "
                  f"{printable(s.get('via') or '?')}  {status}", width),
             _cut(f"{totals[0]} allowed, {totals[1]} denied, {totals[2]} failed; "
                  f"{len(dests)} destination{'s' if len(dests) != 1 else ''}", width),
             ""]
    head = f"{'DESTINATION':<32} {'ALLOW':>5} {'DENY':>5} {'FAIL':>5} {'OPEN':>4} {'UP':>9} {'DOWN':>9}  LAST"
    lines.append(_cut(head, width))
    footer = []
    if state.last_refusal:
        footer = ["", *_wrapped("last: " + printable(state.last_refusal), width, FOOTER_LINES)]
    if height - len(lines) - len(footer) < 2:
        footer = []          # a short terminal: the rows first
    room = max(1, height - len(lines) - len(footer))
    ordered = sorted(dests, key=lambda d: -state.order.get((d.host, d.port), 0))
    for i, d in enumerate(ordered):
        if i == room - 1 and len(ordered) > room:
            lines.append(f"... and {len(ordered) - i} more")
            break
        key = (d.host, d.port)
        target = _target(d.host, d.port)
        last = state.last_reason.get(key) or ("open" if state.open_now.get(key) else
                                              "allowed" if d.opened else "")
        row = (f"{_cut(target, 32):<32} {d.opened - d.would_deny:>5} {d.denied:>5} {d.failed:>5} "
               f"{state.open_now.get(key, 0):>4} {human_bytes(d.bytes_up):>9} "
               f"{human_bytes(d.bytes_down):>9}  {printable(last)}")
        lines.append(_cut(row, width))
    return lines + footer


def follow(path: str, out, *, live: bool, stop_at_end: bool = True, clock=time.monotonic,
           sleep=time.sleep) -> WatchState:
    """Read `path` as it grows, feeding a WatchState; redraw on `out` when
    `live` (a terminal). Returns once run.end is read (or at the file's end
    when not `stop_at_end`)."""
    state = WatchState()
    pending = b""
    drawn_at, dirty = 0.0, True
    with open(path, "rb") as stream:
        while True:
            chunk = stream.read(READ_SIZE)
            if chunk:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    if raw.strip():
                        try:
                            state.feed(parse_line(raw))
                        except RecordError:
                            pass          # a torn or foreign line: skipped, as `vpnw show` does
                dirty = True
                continue
            ended = state.end is not None or not stop_at_end
            if live and dirty and (ended or clock() - drawn_at >= REDRAW_EVERY):
                _draw(state, out)
                drawn_at, dirty = clock(), False
            if ended:
                return state
            sleep(REDRAW_EVERY / 2)


def _draw(state: WatchState, out) -> None:
    size = os.get_terminal_size(out.fileno()) if out.isatty() else os.terminal_size((100, 40))
    out.write(CLEAR + "\n".join(frame(state, size.columns, size.lines - 1)) + "\n")
    out.flush()


def watch(path: str, out=None) -> int:
    """The command's body: follow the run until it ends (Ctrl-C stops
    watching, never the run); a stream that is not a terminal gets one
    frame, at the end."""
    out = out or sys.stdout
    live = out.isatty()
    try:
        state = follow(path, out, live=live)
    except KeyboardInterrupt:
        return 0
    if not live:
        out.write("\n".join(frame(state)) + "\n")
    return 0

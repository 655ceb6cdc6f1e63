"""The broker's side of the record and its status to the orchestrator.

Events are held and written once per loop turn (one write(2) for all the
events of a turn: the recorder wakes less often and the loop spends its time
relaying); connection numbers and the run's totals are counted here, the one
place that writes policy.deny, conn.fail and conn.close. Every event is its
kind's type (stages/record/event_types.py), made by the writer.
"""
from __future__ import annotations

import asyncio
import time

from stages.wire import status as st
from stages.record import event_types as ev
from stages.record.events import Emitter
from stages.broker.workers import ConnNumbers


def ms_since(since: float) -> int:
    return int(round((time.monotonic() - since) * 1000))


class Journal:
    def __init__(self, emitter: Emitter, status_fd: int, numbers=None):
        self.emitter = emitter
        self.status_fd = status_fd
        self.numbers = numbers or ConnNumbers()   # shared with the workers, when there are any
        self.totals = {"connections": 0, "denied": 0, "would_deny": 0, "failed": 0}
        self.flush_scheduled = False
        self.flushed: asyncio.Future | None = None    # done by this turn's flush (written())
        self.loop = None        # the broker's loop, once it runs (flushes are scheduled on it)
        emitter.hold()

    def emit(self, event) -> None:
        """Write one event (an event_types type) at this loop turn's flush."""
        self.emitter.emit(event)
        if not self.flush_scheduled:
            loop = self.loop
            if loop is None:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:  # no loop (yet or any more): write now
                    self.emitter.flush()
                    return
            if not loop.is_running():
                self.emitter.flush()
                return
            loop.call_soon(self.flush_events)
            self.flush_scheduled = True

    def flush_events(self) -> None:
        self.flush_scheduled = False
        self.emitter.flush()
        flushed, self.flushed = self.flushed, None
        if flushed is not None and not flushed.done():
            flushed.set_result(None)

    async def written(self) -> None:
        """Once every event emitted so far is in the event pipe: at this
        loop turn's flush, so that the requests decided in one turn share
        one write (and wake the recorder once), not one write each."""
        if not self.flush_scheduled:
            self.flush_events()         # nothing held, or no loop to flush on
            return
        if self.flushed is None:
            self.flushed = (self.loop or asyncio.get_running_loop()).create_future()
        await asyncio.shield(self.flushed)     # one request cancelled leaves the others waiting

    def status(self, message: st.Message) -> None:
        self.emitter.flush()  # the orchestrator acts on totals: every event goes first
        try:
            st.write(self.status_fd, message)
        except OSError:
            pass

    def report_totals(self) -> None:
        self.status(st.Totals(**self.totals))

    def new_conn(self) -> int:
        self.totals["connections"] += 1
        return self.numbers.next()

    def deny(self, event: ev.PolicyDeny) -> None:
        """policy.deny, counted: a denial, or (--dry-run) one that would have been."""
        self.totals["denied" if event.enforced else "would_deny"] += 1
        self.emit(event)

    def add_totals(self, counts: dict) -> None:
        """A worker's totals, reported at its end, join the run's."""
        for key, value in counts.items():
            self.totals[key] += value

    def fail(self, event: ev.ConnFail) -> None:
        """conn.fail, counted."""
        self.totals["failed"] += 1
        self.emit(event)

    def handshake_failed(self, error: str, reason: str) -> None:
        """A client that never made a whole request: a connection number of
        its own, and its conn.fail at the handshake."""
        self.fail(ev.ConnFail(self.new_conn(), stage="handshake", error=error, reason=reason))

    def close_conn(self, opened) -> None:
        """The one place a connection that was opened ends: its socket (and a
        secret door's TLS stream) closed, its conn.close written. Called once
        per connection by the one that holds it (sessions.py: a tunnel's
        relay, or a kept-alive client's upstream)."""
        if opened.stream is not None:
            opened.stream[1].transport.abort()
        try:
            opened.sock.close()
        except OSError:
            pass
        self.emit(ev.ConnClose(opened.conn, bytes_up=opened.bytes_up, bytes_down=opened.bytes_down,
                               ms=ms_since(opened.opened_at)))

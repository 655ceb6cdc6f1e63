"""A bounded, non-blocking feeder: whole lines to a side output that may stall.

The run file is the one complete copy of a run; a side output (`--events-to`,
a log shipper) is a best-effort copy that must never hold the program. The
feeder keeps at most `limit` bytes of lines for its consumer and writes them
only when the consumer's fd can take them without blocking. A line that does
not fit is dropped and counted, never waited for. The caller owns the loop: it
calls `offer` per line, `pump` when the fd is writable (`wants_write` says
when to watch it), and `drain` at the end for a last bounded chance.

Lines go out in writes of whole lines of at most PIPE_BUF bytes together, so
on a pipe (where such a write is atomic) the consumer never sees a torn line,
even when the feeder gives up. On a stream socket a write may be cut; the
rest of that line goes out next, before anything else.

Reusable by any side output: the fd can be a pipe, a socket, a FIFO.
"""
from __future__ import annotations

import errno
import os
import select
import time
from collections import deque

PIPE_BUF = 4096
DEFAULT_LIMIT = 1 << 20          # 1 MiB: ~5000 events of a typical size


class BoundedFeeder:
    def __init__(self, fd: int, limit: int = DEFAULT_LIMIT):
        self.fd = fd
        self.limit = limit
        os.set_blocking(fd, False)
        self._lines: deque[bytes] = deque()
        self._queued = 0          # bytes held, including the unsent head
        self._head_sent = 0       # bytes of the first held line already written
        self.delivered = 0        # lines written whole
        self.lost = 0             # lines dropped: no room, or the consumer gone
        self.closed = False       # the consumer is gone (EPIPE, or close())
        self.error: OSError | None = None

    @property
    def pending(self) -> int:
        return len(self._lines)

    def wants_write(self) -> bool:
        return bool(self._lines) and not self.closed

    def offer(self, line: bytes) -> bool:
        """Queue one line (with its newline). False: dropped and counted."""
        if self.closed or self._queued + len(line) > self.limit:
            self.lost += 1
            return False
        self._lines.append(line)
        self._queued += len(line)
        return True

    def pump(self) -> None:
        """Write what the fd takes now; never blocks."""
        while self._lines and not self.closed:
            data = self._next_write()
            try:
                written = os.write(self.fd, data)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError as exc:
                self._gone(exc)
                return
            self._consume(written)

    def _next_write(self) -> bytes:
        head = self._lines[0]
        if self._head_sent:
            return head[self._head_sent:]
        if len(self._lines) == 1 or len(head) >= PIPE_BUF:
            return head
        batch, size = [], 0
        for line in self._lines:
            if size + len(line) > PIPE_BUF:
                break
            batch.append(line)
            size += len(line)
        return b"".join(batch)

    def _consume(self, written: int) -> None:
        self._queued -= written
        while written and self._lines:
            rest = len(self._lines[0]) - self._head_sent
            if written >= rest:
                written -= rest
                self._lines.popleft()
                self._head_sent = 0
                self.delivered += 1
            else:
                self._head_sent += written
                written = 0

    def _gone(self, exc: OSError) -> None:
        self.error = exc
        self.closed = True
        self.drop_pending()

    def drop_pending(self) -> int:
        """Give up on everything held (counted as lost); returns how many."""
        n = len(self._lines)
        self.lost += n
        self._lines.clear()
        self._queued = 0
        self._head_sent = 0
        return n

    def drain(self, deadline: float, idle: float) -> bool:
        """Write the backlog until it is empty, `deadline` (monotonic) passes,
        or the consumer takes nothing for `idle` seconds. True when empty."""
        progress_at = time.monotonic()
        while self.wants_write():
            now = time.monotonic()
            wait = min(deadline - now, progress_at + idle - now)
            if wait <= 0:
                break
            try:
                _, writable, _ = select.select([], [self.fd], [], wait)
            except InterruptedError:
                continue
            if writable:
                before = self._queued
                self.pump()
                if self._queued != before:
                    progress_at = time.monotonic()
        return not self._lines

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                os.close(self.fd)
            except OSError as exc:
                if exc.errno != errno.EBADF:
                    raise

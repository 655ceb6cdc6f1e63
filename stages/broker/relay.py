"""The relay: bytes between two sockets, never copied into Python.

Each direction is socket -> pipe -> socket with non-blocking `os.splice`, driven
by the event loop's readiness callbacks on the raw descriptors (no thread per
connection, no asyncio streams: those cost ~3x in bulk throughput here); a
tunnel's first COPY_FIRST bytes each way are copied through Python instead,
so a short connection never makes a pipe (and a long one makes it at its
full size at once). A
direction stops reading while its pipe still holds data, so a slow reader
never makes the broker's memory grow. Where the kernel refuses splice for a
descriptor, that direction falls back to recv_into/send on one buffer.

Half-close: end of stream one way becomes shutdown(SHUT_WR) on the other once
the pipe is drained, so the last byte always arrives; the relay ends when both
directions have ended, or at once on an error or `abort()`.

`BodyCopy` is one direction of the same machinery with a byte limit: it moves
exactly n bytes (an HTTP body, or one chunk's data, whose length the sans-I/O
parser read from the head) and leaves both sockets open, so the bytes after
the body (the next message head) stay in the socket for the parser.
"""
from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import socket

PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_FALLBACK_ERRNOS = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}
_AGAIN = (BlockingIOError, InterruptedError)
# Bounded work per readiness callback, so one busy relay cannot starve others.
_ROUNDS = 16

_pipe_size_cap = [PIPE_SIZE]   # shrinks if the per-user pipe quota is reached


DEFAULT_PIPE_SIZE = 65536


def _new_pipe() -> tuple[int, int, int]:
    # The kernel's default size: most connections are short, and growing the
    # pipe costs a system call they never need (see _Direction._grow).
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    return r, w, DEFAULT_PIPE_SIZE


def _grow_pipe(w: int) -> int | None:
    """Make the pipe PIPE_SIZE (or as large as the per-user quota allows)."""
    size = _pipe_size_cap[0]
    while size > DEFAULT_PIPE_SIZE:
        try:
            return fcntl.fcntl(w, F_SETPIPE_SZ, size)
        except PermissionError:
            # Over fs/pipe-user-pages-soft: smaller pipes still work.
            size //= 4
            _pipe_size_cap[0] = max(size, DEFAULT_PIPE_SIZE)
        except OSError:
            break
    return None


# A tunnel's first bytes each way are copied through Python (recv/send: as
# many system calls as splicing them) and the pipe is made only once a
# direction has moved this much: most connections are short, and a pipe costs
# them a pipe2 and two closes that they never win back. Each read is a bytes
# object of its own, gone once sent: an idle tunnel holds no buffer.
COPY_FIRST = 64 * 1024
COPY_READ = 16 * 1024


class _Direction:
    """One way: src socket -> pipe -> dst socket (after `copy_first` bytes
    copied through a small buffer, when set)."""

    def __init__(self, relay, src: socket.socket, dst: socket.socket, copy_first: int = 0):
        # relay: what this direction reports to (loop, _fail, _direction_done)
        self.relay = relay
        self.src, self.dst = src, dst
        self.src_fd, self.dst_fd = src.fileno(), dst.fileno()
        self.pipe_r = self.pipe_w = -1
        self.pending = 0          # bytes in the pipe (or fallback buffer) not yet sent
        self.bytes = 0            # bytes delivered to dst
        self.eof = False
        self.done = False
        self.limit: int | None = None   # bytes still to read from src; None: to end of stream
        self.reading = False
        self.writing = False
        self.fallback: bytearray | None = None
        self.grown = False
        self.fb_view: memoryview | None = None
        self.fb_start = 0
        self.copy_first = copy_first   # 0: splicing (or for good in the fallback)
        if copy_first:
            self.capacity = COPY_READ
        else:
            self._start_splicing()

    @property
    def splicing(self) -> bool:
        return self.fallback is None and not self.copy_first

    def _start_splicing(self) -> None:
        bulk = bool(self.copy_first)
        self.copy_first = 0
        try:
            self.pipe_r, self.pipe_w, self.capacity = _new_pipe()
        except OSError:
            self._use_fallback()
            return
        self.fallback = self.fb_view = None
        self.fb_start = 0
        if bulk:
            # A tunnel past its first COPY_FIRST bytes is a long transfer:
            # the large pipe at once, not after a round through a small one.
            self._grow()

    def _use_fallback(self) -> None:
        self.copy_first = 0
        self._copy_through(bytearray(256 * 1024))

    def _copy_through(self, buffer: bytearray) -> None:
        self.fallback = buffer
        self.fb_view = memoryview(buffer)
        self.capacity = len(buffer)

    # registration -----------------------------------------------------------
    def start(self) -> None:
        self._want_read(True)

    def _want_read(self, on: bool) -> None:
        if on and not self.reading:
            self.relay.loop.add_reader(self.src_fd, self.on_readable)
        elif not on and self.reading:
            self.relay.loop.remove_reader(self.src_fd)
        self.reading = on

    def _want_write(self, on: bool) -> None:
        if on and not self.writing:
            self.relay.loop.add_writer(self.dst_fd, self.on_writable)
        elif not on and self.writing:
            self.relay.loop.remove_writer(self.dst_fd)
        self.writing = on

    def stop(self) -> None:
        self._want_read(False)
        self._want_write(False)
        for fd in (self.pipe_r, self.pipe_w):
            if fd >= 0:
                os.close(fd)
        self.pipe_r = self.pipe_w = -1

    def _grow(self) -> None:
        # A read filled the pipe: this is a bulk transfer, and a larger pipe
        # means fewer splice calls per byte. Tried once per direction.
        self.grown = True
        self.capacity = _grow_pipe(self.pipe_w) or self.capacity

    # moving bytes -----------------------------------------------------------
    def _fill(self) -> int:
        """Read from src into the pipe; -1 when nothing is ready now, 0 at EOF."""
        if self.copy_first and self.bytes >= self.copy_first:
            self._start_splicing()      # a long transfer: splice from here on
        # Never more than the limit: what follows it is not ours to move.
        want = self.capacity if self.limit is None else min(self.capacity, self.limit)
        if self.copy_first:
            try:
                data = self.src.recv(want)
            except _AGAIN:
                return -1
            self.fb_view, self.fb_start = memoryview(data), 0
            return len(data)
        if self.fallback is None:
            try:
                return os.splice(self.src_fd, self.pipe_w, want, flags=SPLICE_FLAGS)
            except _AGAIN:
                return -1
            except OSError as exc:
                if exc.errno not in _FALLBACK_ERRNOS:
                    raise
                self._use_fallback()
        try:
            n = self.src.recv_into(self.fallback, want)
        except _AGAIN:
            return -1
        self.fb_start = 0
        return n

    def _drain(self) -> None:
        """Send what the pipe holds to dst, as far as dst takes it."""
        while self.pending:
            try:
                if self.fb_view is None:
                    n = os.splice(self.pipe_r, self.dst_fd, self.pending, flags=SPLICE_FLAGS)
                else:
                    n = self.dst.send(self.fb_view[self.fb_start:self.fb_start + self.pending])
                    self.fb_start += n
            except _AGAIN:
                return
            if n <= 0:
                return
            self.pending -= n
            self.bytes += n
        if self.copy_first:
            self.fb_view = None     # the read is sent: nothing held between reads

    def on_readable(self) -> None:
        try:
            for _ in range(_ROUNDS):
                if self.limit == 0:
                    self._finish_at_limit()
                    return
                n = self._fill()
                if n < 0:
                    return
                if n == 0:
                    self.eof = True
                    self._want_read(False)
                    self._finish_if_drained()
                    return
                self.pending = n
                if self.limit is not None:
                    self.limit -= n
                if n >= self.capacity and not self.grown and self.splicing:
                    self._grow()
                self._drain()
                if self.pending:
                    # dst is slow: stop reading until the pipe is empty.
                    self._want_read(False)
                    self._want_write(True)
                    return
        except OSError as exc:
            self.relay._fail(exc)

    def on_writable(self) -> None:
        try:
            self._drain()
            if self.pending:
                return
            self._want_write(False)
            if self.eof:
                self._finish_if_drained()
            elif self.limit == 0:
                self._finish_at_limit()
            else:
                self._want_read(True)
        except OSError as exc:
            self.relay._fail(exc)

    def _finish_at_limit(self) -> None:
        # All of it read and sent: stop, and leave both sockets as they are.
        self._want_read(False)
        self._want_write(False)
        self.done = True
        self.relay._direction_done()

    def _finish_if_drained(self) -> None:
        if self.limit is not None:
            # A bounded copy whose source ended early: the body is cut short.
            self.relay._fail(ConnectionResetError(errno.ECONNRESET, "the stream ended inside a body"))
            return
        if self.pending:
            self._want_write(True)
            return
        try:
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.done = True
        self.relay._direction_done()


class Relay:
    """Relay between `client` and `upstream` (both non-blocking stream
    sockets, already connected) until both directions end. The relay owns
    both sockets from `start()` on and closes them when it ends."""

    def __init__(self, client: socket.socket, upstream: socket.socket,
                 loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop or asyncio.get_running_loop()
        self.client, self.upstream = client, upstream
        for sock in (client, upstream):
            if sock.gettimeout() != 0.0:    # setblocking is a system call every time
                sock.setblocking(False)
        self.up = _Direction(self, client, upstream, COPY_FIRST)      # client -> upstream
        self.down = _Direction(self, upstream, client, COPY_FIRST)    # upstream -> client
        self.finished: asyncio.Future = self.loop.create_future()
        self.error: OSError | None = None

    @property
    def bytes_up(self) -> int:
        return self.up.bytes

    @property
    def bytes_down(self) -> int:
        return self.down.bytes

    def start(self) -> "Relay":
        self.up.start()
        self.down.start()
        return self

    async def wait(self) -> "Relay":
        await asyncio.shield(self.finished)
        return self

    def abort(self) -> None:
        """End now (the broker's grace period is over)."""
        self._close()

    def _direction_done(self) -> None:
        if self.up.done and self.down.done:
            self._close()

    def _fail(self, exc: OSError) -> None:
        if self.error is None:
            self.error = exc
        self._close()

    def _close(self) -> None:
        if self.finished.done():
            return
        self.up.stop()
        self.down.stop()
        for sock in (self.client, self.upstream):
            try:
                sock.close()
            except OSError:
                pass
        self.finished.set_result(None)



class BodyCopy:
    """Moves bodies of known length from `src` to `dst` (non-blocking stream
    sockets that stay open and stay the caller's) through one pipe, reused
    for every copy: `await copy(n)` returns once exactly n bytes arrived at
    dst, or raises OSError (the source ended first, or a socket failed; the
    stream is then not at a message boundary and must be closed). Cancelling
    a copy leaves it the same way. `close()` frees the pipe."""

    def __init__(self, src: socket.socket, dst: socket.socket,
                 loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop or asyncio.get_running_loop()
        self.way = _Direction(self, src, dst)
        self._finished: asyncio.Future | None = None

    async def copy(self, n: int) -> int:
        way = self.way
        if n <= 0:
            return 0
        if way.pending or way.eof or self._finished is not None:
            raise ConnectionResetError(errno.ECONNRESET, "an earlier copy did not finish")
        way.limit, way.done = n, False
        before = way.bytes
        self._finished = self.loop.create_future()
        try:
            way.start()
            way.on_readable()       # the body often waits in the socket already
            await self._finished
        finally:
            way._want_read(False)
            way._want_write(False)
            if way.pending or not way.done:
                way.eof = True          # never reused: the stream is mid-body
            else:
                self._finished = None
        return way.bytes - before

    @property
    def bytes(self) -> int:
        """Bytes delivered to dst by all copies, the cut-short one included."""
        return self.way.bytes

    def close(self) -> None:
        self.way.stop()

    # what the direction reports to
    def _direction_done(self) -> None:
        if not self._finished.done():
            self._finished.set_result(None)

    def _fail(self, exc: OSError) -> None:
        self.way._want_read(False)
        self.way._want_write(False)
        if not self._finished.done():
            self._finished.set_exception(exc)

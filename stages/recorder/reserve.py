"""Room for the record, reserved ahead of what is written (docs/security.md,
"A full disk hides nothing").

The run file keeps at least `low` bytes allocated past its end: fallocate(2)
with FALLOC_FL_KEEP_SIZE gives the file blocks without changing its size or
its content, and a write into them cannot fail for want of space (tmpfs,
ext4, xfs, btrfs). They are taken STEP at a time, so a busy run asks the
file system once per STEP of record. What is left over is given back at the
end (the file truncated to its own size). A file system without fallocate, or a
record that is no regular file (`--record -`), has no reserve: `supported`
is False and the gate stays open (a pipe that stops taking lines blocks the
broker rather than lose them).
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys

FALLOC_FL_KEEP_SIZE = 0x01
F_GETPIPE_SZ = 1032
STEP = 1 << 20
# What the recorder holds in hand at once: one read of the pipe (64 KiB) as
# sealed lines (a digest and a link more on each) and a partial line.
_IN_HAND = 128 << 10
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV)


def low_water(in_fd: int) -> int:
    """Room that must stay reserved after each write: when more cannot be
    had, the event pipe's whole content and what is in hand must still fit."""
    try:
        pipe = fcntl.fcntl(in_fd, F_GETPIPE_SZ)
    except OSError:
        pipe = 1 << 20                # not a pipe (a replay from a file): generous
    return 2 * (pipe + _IN_HAND)


def _fallocate():
    # Only for a run file on disk, after the fork; through _ctypes alone
    # (stages/kernel/foreign.py: `import ctypes` is ~2 ms more on the way to run.start).
    from stages.kernel import foreign
    call = foreign.libc().function(
        "fallocate", (foreign.c_int, foreign.c_int, foreign.c_int64, foreign.c_int64))

    def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
        if call(fd, mode, offset, length) != 0:
            code = foreign.get_errno()
            raise OSError(code, os.strerror(code))
    return fallocate


class Reserve:
    def __init__(self, fd: int, offset: int, low: int):
        self.fd = fd
        self.low = low
        self.end = offset             # reserved up to here
        self.supported = stat.S_ISREG(os.fstat(fd).st_mode)
        self._fallocate = _fallocate() if self.supported else None
        self.error: OSError | None = None

    def ensure(self, written_to: int) -> bool:
        """Room for `low` bytes past `written_to`; False when the file system
        has no more (ENOSPC, EDQUOT, EFBIG: the run must stop dialing)."""
        if not self.supported or self.end - written_to >= self.low:
            return True
        try:
            self._fallocate(self.fd, FALLOC_FL_KEEP_SIZE, written_to, self.low + STEP)
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                self.supported = False
                return True
            self.error = exc
            return False
        self.end = written_to + self.low + STEP
        return True

    def release(self, written_to: int) -> None:
        """Give back what was reserved and not written."""
        if not self.supported or self.end <= written_to:
            return
        # A truncation to the file's own size frees the blocks past its end
        # (ext4 ignores a hole punched past the end; tmpfs, xfs, btrfs take either).
        try:
            if os.fstat(self.fd).st_size == written_to:
                os.ftruncate(self.fd, written_to)
        except OSError:
            pass
        self.end = written_to


FIONREAD = 0x541B


class RecordRoom:
    """The reserve and the record gate, as the recorder's loop uses them.

    `start()` reserves the first room and opens the gate. Before each write,
    `before_write()` keeps the room; when it cannot, the gate closes and the
    recorder goes on only until it has read what the event pipe held then
    (`read()` counts it down, `drained` says when): every dial's decision was
    in the pipe before the broker saw the gate open, and the room left holds
    it. Then the recorder stops and the orchestrator stops the run."""

    def __init__(self, run_fd: int, offset: int | None, in_fd: int, gate):
        self.gate = gate
        self.in_fd = in_fd
        self.reserve = Reserve(run_fd, offset, low_water(in_fd)) if offset is not None else None
        self.closing = False
        self._left = 0

    def start(self, offset: int | None) -> OSError | None:
        if self.reserve is not None and not self.reserve.ensure(offset):
            return self.reserve.error
        if self.gate is not None:
            self.gate.open()
        return None

    def before_write(self, written_to: int | None) -> OSError | None:
        """None, or the error that closed the gate just now."""
        if self.closing or self.reserve is None or self.reserve.ensure(written_to):
            return None
        self.shut()
        return self.reserve.error

    def shut(self) -> None:
        """No dial from now on; what the pipe holds is read, then the recorder stops."""
        if self.gate is not None:
            self.gate.close()
        if not self.closing:
            self.closing = True
            try:
                # A C int, without struct (not otherwise loaded by then).
                self._left = int.from_bytes(fcntl.ioctl(self.in_fd, FIONREAD, b"\0" * 4),
                                            sys.byteorder, signed=True)
            except OSError:
                self._left = 0

    def read(self, n: int) -> None:
        self._left -= n

    @property
    def drained(self) -> bool:
        return self.closing and self._left <= 0

    def finish(self, written_to: int | None) -> None:
        if self.reserve is not None and written_to is not None:
            self.reserve.release(written_to)

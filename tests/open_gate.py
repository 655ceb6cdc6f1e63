"""Hold one process in its open() of a file, until the test lets it go:
fanotify's permission events (FAN_OPEN_PERM, on the file's inode only).

A test that must catch a process between two of its steps (the broker's
loop import begun and not yet done) holds it at a file the second step
opens, instead of racing a signal into a window a few milliseconds wide.
Every other process's open of the file is allowed at once; so is the held
one when the gate closes (a fanotify group's pending events are allowed
when its descriptor is closed). Needs root (CAP_SYS_ADMIN)."""
from __future__ import annotations

import ctypes
import os
import select
import struct
import threading

FAN_CLOEXEC, FAN_NONBLOCK, FAN_CLASS_CONTENT = 0x1, 0x2, 0x4
FAN_MARK_ADD = 0x1
FAN_OPEN_PERM = 0x10000
FAN_ALLOW = 0x1
AT_FDCWD = -100
_METADATA = struct.Struct("=IBBHQii")       # struct fanotify_event_metadata
_RESPONSE = struct.Struct("=iI")           # struct fanotify_response

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
_libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]


class OpenGate:
    """Holds the first open of any of `paths` by a process `hold(pid)` says
    yes to. `held` is set once one is held; `release()` lets it go."""

    def __init__(self, paths, hold):
        self._hold = hold
        self.held = threading.Event()
        self.held_pid: int | None = None
        self._held_fd: int | None = None
        self._lock = threading.Lock()
        fd = _libc.fanotify_init(FAN_CLOEXEC | FAN_NONBLOCK | FAN_CLASS_CONTENT, os.O_RDONLY)
        if fd < 0:
            raise OSError(ctypes.get_errno(), f"fanotify_init: {os.strerror(ctypes.get_errno())}")
        self._fd = fd
        for path in paths:
            if _libc.fanotify_mark(fd, FAN_MARK_ADD, FAN_OPEN_PERM, AT_FDCWD, os.fsencode(path)) != 0:
                err = ctypes.get_errno()
                os.close(fd)
                raise OSError(err, f"fanotify_mark {path}: {os.strerror(err)}")
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._serve, name="open-gate", daemon=True)
        self._thread.start()

    def _answer(self, event_fd: int) -> None:
        try:
            os.write(self._fd, _RESPONSE.pack(event_fd, FAN_ALLOW))
        except OSError:
            pass            # the opener is gone (killed while held)
        os.close(event_fd)

    def _serve(self) -> None:
        while True:
            ready, _, _ = select.select([self._fd, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                data = os.read(self._fd, 4096)
            except BlockingIOError:
                continue
            at = 0
            while at + _METADATA.size <= len(data):
                length, _vers, _res, _mlen, mask, event_fd, pid = _METADATA.unpack_from(data, at)
                at += length
                if event_fd < 0:
                    continue
                with self._lock:
                    if self._held_fd is None and not self.held.is_set() and self._hold(pid):
                        self._held_fd, self.held_pid = event_fd, pid
                        self.held.set()
                        continue
                self._answer(event_fd)

    def release(self) -> None:
        """Let the held open go on (nothing if none is held)."""
        with self._lock:
            if self._held_fd is not None:
                self._answer(self._held_fd)
                self._held_fd = None

    def close(self) -> None:
        if self._thread is None:
            return
        self.release()
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=10)
        self._thread = None
        for fd in (self._fd, self._stop_r, self._stop_w):
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

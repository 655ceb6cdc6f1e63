"""The socket files a connect may reach by path: those the program's
processes bound inside (recorded at each listen()) and those the policy's
[unix] allow names, by identity (judge.identity_key); and the table of them
the compiled path reads (fast_continue.c, `struct slot`)."""
from __future__ import annotations

import os
import struct
import threading

from stages.helper.supervisor import judge
from stages.helper.supervisor.judge import AF_UNIX
from stages.kernel import seccomp_notify as sn
from stages.kernel import unix_diag

# The sockets recorded as bound inside at most (each keeps an O_PATH fd);
# past it those no longer listened on are dropped (sock_diag), and past that
# a new one is not recorded (connects to it are refused).
MAX_BOUND = 1024


def identity(fd: int, st: os.stat_result | None = None) -> tuple | None:
    """judge.identity_key of the file `fd`."""
    st = st or os.fstat(fd)
    try:
        return judge.identity_key(st.st_dev, st.st_ino, sn.file_handle(fd), 0)
    except OSError:
        pass
    try:
        fs_type = sn.file_system_type(fd)       # asked only without a handle
    except OSError:
        return None                             # unknown: as if its numbers repeat
    return judge.identity_key(st.st_dev, st.st_ino, None, fs_type)


class BoundTable:
    """The recorded identities that have a handle, in a buffer the compiled
    path reads without the GIL (fast_continue.c, `struct slot`): a count of
    slots in use, then MAX_BOUND slots. A slot is written under a sequence
    number, odd while it changes: the reader takes a slot only when the
    number is even and the same before and after its read (a seqlock), so it
    never matches on half a slot. Written under BoundSockets.lock only."""
    BOUND, NAMED = 1, 2
    HEAD = struct.Struct("=I4x")
    SEQ = struct.Struct("=I")
    BODY = struct.Struct("=IQiI64s")        # kind, st_dev, handle_type, handle_bytes, f_handle
    SLOT = SEQ.size + BODY.size             # 88
    HANDLE_MAX = 64

    def __init__(self):
        self.data = bytearray(self.HEAD.size + MAX_BOUND * self.SLOT)
        self.used = 0                       # slots ever written (the count at the head)
        self._free_slots: list[int] = []    # of those, cleared since

    @property
    def free(self) -> int:
        return len(self._free_slots) + MAX_BOUND - self.used

    def put(self, kind: int, key: tuple) -> int | None:
        """A slot for ("handle", dev, type, bytes); None when none is free or
        the handle is longer than a slot holds (then only the Python path
        matches it)."""
        _, dev, handle_type, handle = key
        if len(handle) > self.HANDLE_MAX:
            return None
        if self._free_slots:
            slot = self._free_slots.pop()
        elif self.used < MAX_BOUND:
            slot = self.used
        else:
            return None
        self._write(slot, kind, dev, handle_type, handle)
        if slot == self.used:
            self.used += 1
            self.HEAD.pack_into(self.data, 0, self.used)
        return slot

    def clear(self, slot: int) -> None:
        self._write(slot, 0, 0, 0, b"")
        self._free_slots.append(slot)

    def _write(self, slot: int, kind: int, dev: int, handle_type: int, handle: bytes) -> None:
        at = self.HEAD.size + slot * self.SLOT
        seq = self.SEQ.unpack_from(self.data, at)[0]
        self.SEQ.pack_into(self.data, at, (seq + 1) & 0xFFFFFFFF)        # odd: changing
        self.BODY.pack_into(self.data, at + self.SEQ.size, kind, dev, handle_type, len(handle), handle)
        self.SEQ.pack_into(self.data, at, (seq + 2) & 0xFFFFFFFF)        # even: whole again


class BoundSockets:
    """The identities a Unix path may lead to. `bound`: the socket files
    the program's processes bound, recorded as each listens: an O_PATH fd
    each, kept (its inode, and so its handle, stays theirs), and a slot of
    the table the compiled path matches against. `named`: the policy's
    sockets, by the same identity (their fds were opened when the run
    started, before the sandbox's mounts). Changed under `lock` (the
    supervisor's, which also guards its counts)."""

    def __init__(self, named: list, lock: threading.Lock):
        """`named`: launch.NamedSocket each (the entry as written, an O_PATH fd)."""
        self.lock = lock
        self.diag = unix_diag.open_diag()
        self.diag_lock = threading.Lock()   # one dump at a time on the one socket
        self.bound: dict[tuple, tuple[int, int, int, int | None]] = {}   # key -> (fd, dev, ino, slot)
        self.table = BoundTable()
        self.named: dict[tuple, str] = {}
        for entry in named:
            key = identity(entry.fd)
            if key is not None:
                self.named[key] = entry.entry
                if key[0] == "handle":
                    self.table.put(BoundTable.NAMED, key)

    def record_listener(self, call) -> None:
        """A listen() (`call`: live_call.LiveCall): the file the socket is bound to (SIOCUNIXFILE: the
        inode its bind made, whatever was renamed since) is recorded as
        bound inside, when the socket is a Unix one made in the sandbox's
        network namespace. Anything else is let go on unrecorded: the
        kernel's listen() cannot reach anything."""
        if call.sock_error or call.domain != AF_UNIX or not call.made_inside:
            return
        try:
            fd = sn.unix_file(call.sock)
        except OSError:
            return          # bound to no file (abstract, autobind at listen)
        try:
            st = os.fstat(fd)
            key = identity(fd, st)
        except OSError:
            key = None
        with self.lock:
            if key is None or key in self.bound or not self._room_for_one():
                os.close(fd)
                return
            slot = self.table.put(BoundTable.BOUND, key) if key[0] == "handle" else None
            self.bound[key] = (fd, st.st_dev, st.st_ino, slot)

    def _room_for_one(self) -> bool:
        """(self.lock) A record may be added: under MAX_BOUND, after those
        of sockets no longer listened on (sock_diag) are dropped. Past it,
        a new socket is not recorded, and connects to it are refused."""
        if len(self.bound) < MAX_BOUND and self.table.free:
            return True
        try:
            with self.diag_lock:
                alive = unix_diag.listening_files(self.diag)
        except (OSError, unix_diag.DiagError):
            return False
        for key, (fd, dev, ino, slot) in list(self.bound.items()):
            if (dev, ino & 0xFFFFFFFF) not in alive:
                del self.bound[key]
                if slot is not None:
                    self.table.clear(slot)
                os.close(fd)
        return len(self.bound) < MAX_BOUND and bool(self.table.free)

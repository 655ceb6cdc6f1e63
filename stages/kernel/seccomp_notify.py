"""The kernel calls a seccomp user-notification supervisor needs, through `_ctypes`.

Python 3.11 has none of them: the notification ioctls (SECCOMP_IOCTL_NOTIF_RECV,
_SEND, _ID_VALID: through fcntl.ioctl, which lets go of the GIL while it
waits), pidfd_getfd, openat2, process_vm_readv, SIOCUNIXFILE,
SO_NETNS_COOKIE, name_to_handle_at, fstatfs (through `_ctypes`
alone, stages/kernel/foreign.py: the `ctypes` package's Python half, ~3 ms
of CPU in the supervisor's process as it starts, is not loaded). Each
wrapper raises OSError with the kernel's errno; nothing here decides anything
(stages/helper/supervisor/ does). Layouts: include/uapi/linux/seccomp.h,
openat2.h, sockios.h, un.h, asm-generic/socket.h, fcntl.h.
"""
from __future__ import annotations

import fcntl
import os
import struct

from stages.kernel import foreign

# x86_64 syscall numbers (the filter refuses every other arch).
from stages.kernel.privileges import SYS_OPENAT2, SYS_PIDFD_GETFD, SYS_PIDFD_OPEN  # noqa: F401

_libc = foreign.libc()
_ioctl = _libc.function("ioctl", (foreign.c_int, foreign.c_ulong, foreign.c_void_p))
_connect = _libc.function("connect", (foreign.c_int, foreign.c_char_p, foreign.c_uint))

# struct seccomp_notif {u64 id; u32 pid; u32 flags; struct seccomp_data data}
# struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}
NOTIF = struct.Struct("=QIIiIQ6Q")                   # 80 bytes
# struct seccomp_notif_resp {u64 id; s64 val; s32 error; u32 flags}
NOTIF_RESP = struct.Struct("=QqiI")                  # 24 bytes
_U64 = struct.Struct("=Q")


def _iowr(nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (ord("!") << 8) | nr


NOTIF_RECV = _iowr(0, NOTIF.size)
NOTIF_SEND = _iowr(1, NOTIF_RESP.size)
NOTIF_ID_VALID = (1 << 30) | (8 << 16) | (ord("!") << 8) | 2
NOTIF_SET_FLAGS = (1 << 30) | (8 << 16) | (ord("!") << 8) | 4
USER_NOTIF_FD_SYNC_WAKE_UP = 1
USER_NOTIF_FLAG_CONTINUE = 1
PIDFD_THREAD = os.O_EXCL

RESOLVE_NO_MAGICLINKS, RESOLVE_IN_ROOT = 0x02, 0x10


def _check(res: int, what: str) -> int:
    if res < 0:
        e = foreign.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return res


class Notification:
    """One pending syscall: its id, the thread that made it (a TID in the
    reader's PID namespace), the syscall number, its architecture
    (AUDIT_ARCH_*) and its six arguments."""
    __slots__ = ("id", "pid", "nr", "arch", "args")

    def __init__(self, raw: bytes):
        fields = NOTIF.unpack(raw)
        self.id, self.pid, self.nr, self.arch = fields[0], fields[1], fields[3], fields[4]
        self.args = fields[6:12]


_NOTIF_ZEROS = bytes(NOTIF.size)


def receive(listener: int, buf: bytearray | None = None) -> Notification:
    """Block for the next notification (the buffer must be zeroed: the kernel
    refuses anything else with EINVAL). fcntl.ioctl lets go of the GIL while
    it waits, so several threads may wait here at once: the kernel hands each
    notification to one of them. `buf`: a thread's own, reused."""
    if buf is None:
        buf = bytearray(NOTIF.size)
    else:
        buf[:] = _NOTIF_ZEROS
    fcntl.ioctl(listener, NOTIF_RECV, buf, True)
    return Notification(buf)


def respond(listener: int, notif_id: int, value: int = 0, error: int = 0) -> None:
    """Answer a notification: the syscall returns `value`, or fails with
    `error` (a positive errno). ENOENT: the syscall was interrupted meanwhile,
    and nobody waits for the answer any more."""
    fcntl.ioctl(listener, NOTIF_SEND, NOTIF_RESP.pack(notif_id, value, -error if error else 0, 0))


def go_on(listener: int, notif_id: int) -> None:
    """Answer a notification with SECCOMP_USER_NOTIF_FLAG_CONTINUE: the kernel
    runs the program's own call, reading its fd and its arguments again.
    ENOENT when the thread no longer waits (then nothing is run): the answer
    itself is checked against the pending notification, as NOTIF_ID_VALID
    would."""
    fcntl.ioctl(listener, NOTIF_SEND, NOTIF_RESP.pack(notif_id, 0, 0, USER_NOTIF_FLAG_CONTINUE))


def still_pending(listener: int, notif_id: int) -> bool:
    """True while the thread still waits in the notified syscall: its TID has
    not been reused, so what was read through it was read from it."""
    try:
        fcntl.ioctl(listener, NOTIF_ID_VALID, _U64.pack(notif_id))
    except OSError:
        return False
    return True


def wake_up_synchronously(listener: int) -> bool:
    """Ask the kernel (6.6+) to hand the CPU straight from the notifying
    thread to the supervisor and back (SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP):
    a round trip without a trip through the scheduler. False where the
    kernel lacks it: the notifications work the same, more slowly. The
    flags are the ioctl's argument itself, not a pointer to them (the kernel's
    seccomp_notify_set_flags; a pointer is refused with EINVAL)."""
    return _ioctl(listener, NOTIF_SET_FLAGS, USER_NOTIF_FD_SYNC_WAKE_UP) == 0


def pidfd_open(pid: int, flags: int = 0) -> int:
    return os.pidfd_open(pid, flags)


_pidfd_getfd = _libc.function("syscall", (foreign.c_long, foreign.c_int, foreign.c_int, foreign.c_uint),
                               restype=foreign.c_long)


def pidfd_getfd(pidfd: int, targetfd: int) -> int:
    """A duplicate, in this process, of fd `targetfd` of the process `pidfd`
    names (the same open file: the same socket). Close-on-exec."""
    return _check(_pidfd_getfd(SYS_PIDFD_GETFD, pidfd, targetfd, 0), "pidfd_getfd")


class _OpenHow(foreign.Structure):
    _fields_ = [("flags", foreign.c_ulonglong), ("mode", foreign.c_ulonglong),
                ("resolve", foreign.c_ulonglong)]      # __u64 each


_openat2 = _libc.function("syscall", (foreign.c_long, foreign.c_int, foreign.c_char_p, foreign.c_void_p,
                                      foreign.c_size_t), restype=foreign.c_long)


def openat2(dirfd: int, path: bytes, flags: int, resolve: int) -> int:
    how = _OpenHow(flags, 0, resolve)
    return _check(_openat2(SYS_OPENAT2, dirfd, path, foreign.byref(how), foreign.sizeof(how)),
                  "openat2")


class _IoVec(foreign.Structure):
    _fields_ = [("base", foreign.c_void_p), ("len", foreign.c_size_t)]


_process_vm_readv = _libc.function(
    "process_vm_readv", (foreign.c_int, foreign.POINTER(_IoVec), foreign.c_ulong,
                         foreign.POINTER(_IoVec), foreign.c_ulong, foreign.c_ulong),
    restype=foreign.c_long)      # ssize_t


def read_memory(pid: int, address: int, length: int) -> bytes:
    """`length` bytes at `address` in process `pid`, in one read; EFAULT when
    any of them is not mapped (what the syscall itself would have said)."""
    return MemoryReader(length).read(pid, address, length)


class MemoryReader:
    """process_vm_readv into a buffer of its own, made once: a supervisor
    thread reads every connect's address through one of these, with no
    _ctypes object made per read. One per thread (the buffer is shared by
    its reads)."""
    __slots__ = ("buf", "local", "remote", "_local", "_remote")

    def __init__(self, size: int):
        self.buf = foreign.buffer(max(size, 1))
        self.local = _IoVec(foreign.addressof(self.buf), 0)
        self.remote = _IoVec(0, 0)
        self._local, self._remote = foreign.byref(self.local), foreign.byref(self.remote)

    def read(self, pid: int, address: int, length: int) -> bytes:
        """As read_memory; `length` at most the buffer's size."""
        self.local.len = self.remote.len = length
        self.remote.base = address
        got = _check(_process_vm_readv(pid, self._local, 1, self._remote, 1, 0),
                     "process_vm_readv")
        if got != length:
            raise OSError(14, "process_vm_readv: a short read (EFAULT)")
        return self.buf.raw[:length]


def connect_raw(fd: int, address: bytes) -> int:
    """connect(2) with the address's bytes as they are; 0 or a positive errno."""
    if _connect(fd, address, len(address)) == 0:
        return 0
    return foreign.get_errno()


_getsockopt = _libc.function("getsockopt", (foreign.c_int, foreign.c_int, foreign.c_int,
                                            foreign.c_void_p, foreign.c_void_p))
SOL_SOCKET, SO_DOMAIN = 1, 39


def socket_domain(fd: int) -> int:
    """SO_DOMAIN of the socket `fd` (ENOTSOCK for any other file)."""
    value, size = foreign.c_int(0), foreign.c_uint(foreign.sizeof(foreign.c_int))
    _check(_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, foreign.byref(value), foreign.byref(size)),
           "getsockopt")
    return value.value


class DomainReader:
    """socket_domain through buffers of its own, made once (one per thread)."""
    __slots__ = ("value", "size", "_value", "_size")

    def __init__(self):
        self.value, self.size = foreign.c_int(0), foreign.c_uint(foreign.sizeof(foreign.c_int))
        self._value, self._size = foreign.byref(self.value), foreign.byref(self.size)

    def __call__(self, fd: int) -> int:
        self.size.value = foreign.sizeof(foreign.c_int)
        _check(_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, self._value, self._size), "getsockopt")
        return self.value.value


SIOCUNIXFILE = 0x89E0           # SIOCPROTOPRIVATE + 0 (include/uapi/linux/un.h), Linux 5.15


def unix_file(fd: int) -> int:
    """An O_PATH fd of the file the Unix socket `fd` is bound to: the very
    inode its bind made, whatever has been renamed or linked since (the
    kernel's unix_open_file). ENOENT when it is bound to no file (unbound,
    abstract); EPERM unless this process administers the socket's network
    namespace."""
    return _check(_ioctl(fd, SIOCUNIXFILE, None), "SIOCUNIXFILE")


SO_NETNS_COOKIE = 71             # Linux 5.14
_COOKIE = struct.Struct("=Q")


class CookieReader:
    """SO_NETNS_COOKIE of a socket: the 64-bit cookie of the network
    namespace it was made in, which the kernel never gives to another
    namespace while it runs. Buffers of its own, made once (one per thread)."""
    __slots__ = ("value", "size", "_value", "_size")

    def __init__(self):
        self.value, self.size = foreign.c_ulong(0), foreign.c_uint(8)
        self._value, self._size = foreign.byref(self.value), foreign.byref(self.size)

    def __call__(self, fd: int) -> int:
        self.size.value = 8
        _check(_getsockopt(fd, SOL_SOCKET, SO_NETNS_COOKIE, self._value, self._size),
               "getsockopt(SO_NETNS_COOKIE)")
        return self.value.value


AT_EMPTY_PATH, AT_HANDLE_FID = 0x1000, 0x200
MAX_HANDLE_SZ = 128
_name_to_handle_at = _libc.function("name_to_handle_at", (foreign.c_int, foreign.c_char_p, foreign.c_void_p,
                                                          foreign.c_void_p, foreign.c_int))
_HANDLE_HEAD = struct.Struct("=Ii")      # struct file_handle {u32 handle_bytes; int handle_type; ...}


def file_handle(fd: int) -> tuple[int, bytes]:
    """(handle_type, f_handle) of the file `fd` (name_to_handle_at with
    AT_EMPTY_PATH): what the file system names the inode by for NFS, with
    its generation (tmpfs: a random one per inode), so that no other file
    of that file system ever has it. AT_HANDLE_FID (Linux 6.5: a handle only
    to compare, which overlayfs gives without nfs_export) first, then
    without. EOPNOTSUPP on a file system that has none."""
    buf = foreign.buffer(_HANDLE_HEAD.size + MAX_HANDLE_SZ)
    mount_id = foreign.c_int(0)
    err = 0
    for flags in (AT_EMPTY_PATH | AT_HANDLE_FID, AT_EMPTY_PATH):
        buf.raw = _HANDLE_HEAD.pack(MAX_HANDLE_SZ, 0)
        if _name_to_handle_at(fd, b"", foreign.addressof(buf), foreign.byref(mount_id), flags) == 0:
            raw = buf.raw
            size, kind = _HANDLE_HEAD.unpack_from(raw)
            return kind, raw[_HANDLE_HEAD.size:_HANDLE_HEAD.size + min(size, MAX_HANDLE_SZ)]
        err = foreign.get_errno()
        if err != 22:           # EINVAL: no AT_HANDLE_FID before 6.5
            break
    raise OSError(err, f"name_to_handle_at: {os.strerror(err)}")


_fstatfs = _libc.function("fstatfs", (foreign.c_int, foreign.c_void_p))


def file_system_type(fd: int) -> int:
    """f_type of the file system `fd` is on (fstatfs; the first field of
    struct statfs, a long)."""
    buf = foreign.buffer(120)       # sizeof(struct statfs) on LP64
    _check(_fstatfs(fd, foreign.addressof(buf)), "fstatfs")
    return int.from_bytes(buf.raw[:foreign.sizeof(foreign.c_long)], "little", signed=True)

"""Thin wrappers for the kernel calls Python 3.11 lacks: unshare, prctl, capset, mount.

Through `_ctypes` alone (stages/kernel/foreign.py): the helper, init and the
program's process call these on their way to the seal, and the `ctypes`
package's Python half cost the helper ~3 ms of CPU before its plan
(docs/architecture.md, "Start-up budget")."""
from __future__ import annotations

import errno
import os

from stages.kernel import foreign

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
SANDBOX_NAMESPACES = CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNS
NAMESPACE_NAMES = ["user", "net", "pid", "ipc", "mnt"]

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

SECBIT_NOROOT = 1 << 0
SECBIT_NOROOT_LOCKED = 1 << 1
SECBIT_NO_SETUID_FIXUP = 1 << 2
SECBIT_NO_SETUID_FIXUP_LOCKED = 1 << 3
SECBIT_KEEP_CAPS_LOCKED = 1 << 5
SECBIT_NO_CAP_AMBIENT_RAISE = 1 << 6
SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED = 1 << 7
# execve must never hand capabilities back, whatever uid the program has
# inside the namespace (root there is the caller's root mapped to itself).
LOCKED_SECUREBITS = (SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP
                     | SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED
                     | SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED)

MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_REC, MS_PRIVATE = 0x4000, 1 << 18

_libc = foreign.libc()
_unshare = _libc.function("unshare", (foreign.c_int,))
_prctl = _libc.function("prctl", (foreign.c_int, foreign.c_ulong, foreign.c_ulong, foreign.c_ulong,
                                  foreign.c_ulong))
_mount = _libc.function("mount", (foreign.c_char_p, foreign.c_char_p, foreign.c_char_p,
                                  foreign.c_ulong, foreign.c_void_p))
_umount2 = _libc.function("umount2", (foreign.c_char_p, foreign.c_int))
_capset = _libc.function("capset", (foreign.c_void_p, foreign.c_void_p))
_syscall4 = _libc.function("syscall", (foreign.c_long, foreign.c_int, foreign.c_int, foreign.c_int,
                                       foreign.c_int), restype=foreign.c_long)

# x86_64 syscall numbers (the filter refuses every other arch): what the
# Unix-socket supervisor needs beyond seccomp (stages/kernel/seccomp_notify.py).
SYS_PIDFD_OPEN, SYS_OPENAT2, SYS_PIDFD_GETFD = 434, 437, 438


def _check(res: int, what: str) -> int:
    if res == -1:
        e = foreign.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return res


def unshare(flags: int) -> None:
    _check(_unshare(flags), "unshare")


def prctl(option: int, a2: int = 0, a3: int = 0, a4: int = 0, a5: int = 0) -> int:
    return _check(_prctl(option, a2, a3, a4, a5), f"prctl({option})")


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


MNT_DETACH = 2


def umount(target: str, flags: int = 0) -> None:
    _check(_umount2(target.encode(), flags), f"umount {target}")


def write_id_maps(uid: int, gid: int, *, root_inside: bool = False) -> None:
    """Map the caller's own uid/gid into the new user namespace, as themselves
    (the sandbox) or as root (a path namespace, whose tools need
    CAP_NET_ADMIN over it across execve); no supplementary groups."""
    inside_uid, inside_gid = (0, 0) if root_inside else (uid, gid)
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{inside_uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{inside_gid} {gid} 1")


def cap_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except OSError:
        return 63


class _CapHeader(foreign.Structure):
    _fields_ = [("version", foreign.c_uint), ("pid", foreign.c_int)]     # __u32, int


class _CapData(foreign.Structure):
    _fields_ = [("effective", foreign.c_uint), ("permitted", foreign.c_uint),
                ("inheritable", foreign.c_uint)]                          # __u32 each


def drop_all_privileges() -> None:
    """A real drop: securebits locked first, bounding and ambient sets cleared,
    every capability set emptied, then no_new_privs. capset alone is not a drop:
    execve as uid 0 would give the full set back."""
    prctl(PR_SET_SECUREBITS, LOCKED_SECUREBITS)
    for cap in range(cap_last_cap() + 1):
        prctl(PR_CAPBSET_DROP, cap)
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _check(_capset(foreign.addressof(header), foreign.addressof(data)), "capset")
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def supervisor_syscalls_missing() -> str | None:
    """None when pidfd_open, pidfd_getfd and openat2 exist; else which is missing."""
    for name, nr in (("pidfd_open", SYS_PIDFD_OPEN), ("pidfd_getfd", SYS_PIDFD_GETFD),
                     ("openat2", SYS_OPENAT2)):
        # Bad arguments on purpose: ENOSYS says the call is missing, any other
        # error that it is there.
        if _syscall4(nr, -1, -1, 0, 0) < 0 and foreign.get_errno() == errno.ENOSYS:
            return name
    return None

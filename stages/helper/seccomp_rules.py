"""The seccomp filter the program runs under: rules as data, then libseccomp.

`filter_rules()` is pure (a list of SyscallRule records) so tests can read exactly
what is refused; `build_filter()` turns them into a libseccomp context
(through pyseccomp) and `filter_bpf()` into the BPF program that the
program's process loads (`load_bpf`) just before exec.

Order of concern (libseccomp emits the arch check first by construction):
1. a syscall from a non-native arch (i386 `int 0x80`) or an x32 number
   (nr | 0x40000000) gets the bad-arch action, ENOSYS: the x86_64 filter
   refuses both before any per-syscall rule is looked at;
2. io_uring (it can open sockets and connect without calling socket());
3. socket families other than AF_INET, AF_INET6, AF_NETLINK (socketpair:
   the same, plus AF_UNIX);
4. Unix socketpairs other than SOCK_STREAM and SOCK_SEQPACKET;
5. TIOCSTI / TIOCLINUX, the keyring, new user namespaces, clone3; with the
   supervisor, a clone that shares the fd table with another process.

`supervised` (docs/security.md, "Unix sockets"): AF_UNIX stream and seqpacket
sockets may be made, datagram ones stay refused, and every connect() and
listen() goes to the supervisor (SECCOMP_RET_USER_NOTIF,
stages/helper/supervisor/), which records the socket files the
program's listeners are bound to and connects only to those, or to sockets
named by the policy.
"""
from __future__ import annotations

import errno
import os

from stages.kernel import foreign
from stages.kernel.privileges import PR_SET_NO_NEW_PRIVS, prctl
from stages.startup.records import NamedTuple  # typing's, without importing typing

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCK_STREAM, SOCK_SEQPACKET = 1, 5
# socketpair(2)'s type argument carries SOCK_CLOEXEC/SOCK_NONBLOCK above the
# type; the kernel keeps only these low four bits as the type (and rejects any
# other flag with EINVAL), so the type rules look only at them.
SOCK_TYPE_BITS = 4
# The pairs a program may make: both are born connected to each other and can
# never be pointed anywhere else (docs/security.md, tests/bypass/test_unix_pairs.py).
# SOCK_DGRAM stays refused: a datagram socket can be re-connect()ed, or given a
# destination in sendto(), and so reach any datagram socket on the machine by
# path (journald, syslog, notify sockets). SOCK_RAW is the kernel's alias for
# SOCK_DGRAM in AF_UNIX, so it is refused with it.
CONNECTED_PAIR_TYPES = frozenset({SOCK_STREAM, SOCK_SEQPACKET})
CLONE_NEWUSER = 0x10000000
CLONE_FILES, CLONE_THREAD = 0x400, 0x10000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C

# A refused socket family gets EAFNOSUPPORT: that is what the kernel itself
# says for a family it does not have, so programs take their usual "no such
# transport" path. Everything else that is a policy refusal gets EPERM.
REFUSED_FAMILY_ERRNO = errno.EAFNOSUPPORT


class SyscallRule(NamedTuple):
    """Refuse `syscall` with `errno_` when every (arg, mask, value) matches."""
    syscall: str
    errno_: int
    args: tuple[tuple[int, int, int], ...] = ()
    notify: bool = False      # not refused: sent to the supervisor (errno_ unused)


def complement_patterns(allowed: set[int], bits: int) -> list[tuple[int, int]]:
    """(mask, value) pairs whose union is exactly the `bits`-bit values not in `allowed`.

    seccomp (and libseccomp) can only OR together masked equalities, so "any
    family but these" is spelled as a prefix cover of the complement: walking
    from the top bit down, every branch that holds no allowed value becomes one
    pattern.
    """
    out: list[tuple[int, int]] = []

    def walk(candidates: set[int], bit: int, mask: int, value: int) -> None:
        if bit < 0:
            return
        for b in (0, 1):
            sub = {v for v in candidates if (v >> bit) & 1 == b}
            m, val = mask | (1 << bit), value | (b << bit)
            if not sub:
                out.append((m, val))
            else:
                walk(sub, bit - 1, m, val)

    walk({v & ((1 << bits) - 1) for v in allowed}, bits - 1, 0, 0)
    return out


def allowed_families(allow_unix_sockets: bool) -> set[int]:
    fams = {AF_INET, AF_INET6, AF_NETLINK}
    if allow_unix_sockets:
        fams.add(AF_UNIX)
    return fams


def filter_rules(allow_unix_sockets: bool, supervised: bool = False) -> list[SyscallRule]:
    rules = [SyscallRule(name, errno.ENOSYS) for name in
             ("io_uring_setup", "io_uring_enter", "io_uring_register")]
    # socket(int family, ...): the kernel reads only the low 32 bits, so the
    # patterns look only at those (a 64-bit compare would let 0x1_00000001
    # through as AF_UNIX).
    families = allowed_families(allow_unix_sockets or supervised)
    for mask, value in complement_patterns(families, 32):
        rules.append(SyscallRule("socket", REFUSED_FAMILY_ERRNO, ((0, mask, value),)))
    if supervised and not allow_unix_sockets:
        rules.extend(_supervised_unix_rules())
    # socketpair(int family, ...) makes sockets of its family too (TIPC can):
    # the same family rule as socket(), plus AF_UNIX, whose pairs the type
    # rule below narrows.
    for mask, value in complement_patterns(allowed_families(allow_unix_sockets) | {AF_UNIX}, 32):
        rules.append(SyscallRule("socketpair", REFUSED_FAMILY_ERRNO, ((0, mask, value),)))
    if not allow_unix_sockets:
        # A stream or seqpacket socketpair is a private channel between two
        # fds of this process tree (asyncio, libuv and Node use stream pairs
        # for child stdio; Codex CLI and Chromium's crashpad use seqpacket
        # ones): the kernel keeps each end connected to the other for life.
        for mask, value in complement_patterns(set(CONNECTED_PAIR_TYPES), SOCK_TYPE_BITS):
            rules.append(SyscallRule("socketpair", errno.EPERM,
                              ((0, 0xFFFFFFFF, AF_UNIX), (1, mask, value))))
    for cmd in (TIOCSTI, TIOCLINUX):
        rules.append(SyscallRule("ioctl", errno.EPERM, ((1, 0xFFFFFFFF, cmd),)))
    for name in ("add_key", "request_key", "keyctl"):
        rules.append(SyscallRule(name, errno.EPERM))
    rules.append(SyscallRule("unshare", errno.EPERM, ((0, CLONE_NEWUSER, CLONE_NEWUSER),)))
    rules.append(SyscallRule("clone", errno.EPERM, ((0, CLONE_NEWUSER, CLONE_NEWUSER),)))
    # clone3 passes its flags in a struct seccomp cannot read; ENOSYS makes
    # glibc fall back to clone(), whose flags the rule above can check.
    rules.append(SyscallRule("clone3", errno.ENOSYS))
    return rules


def _supervised_unix_rules() -> list[SyscallRule]:
    """A Unix socket of the connected kinds only (the same types as the
    pairs); each connect() of any socket to the supervisor: the filter cannot
    see a socket's family, and a connect the kernel went on with after our
    look could meet another socket under the same fd number."""
    rules = [SyscallRule("socket", errno.EPERM, ((0, 0xFFFFFFFF, AF_UNIX), (1, mask, value)))
             for mask, value in complement_patterns(set(CONNECTED_PAIR_TYPES), SOCK_TYPE_BITS)]
    rules.append(SyscallRule("connect", 0, notify=True))
    # Each listen() too: the supervisor records the file the socket is bound
    # to (the one its bind made, SIOCUNIXFILE) as one of the sandbox's own,
    # by an identity that cannot repeat, before the kernel goes on with it.
    rules.append(SyscallRule("listen", 0, notify=True))
    # A process that shares its fd table with another process (clone with
    # CLONE_FILES but not CLONE_THREAD): refused, so that the only tasks that
    # can change a thread's fd table are the threads of its own group, and a
    # connect from a group of one thread may be let go on ("continue") once
    # its socket is seen to be TCP (docs/security.md, "Unix sockets by
    # origin"). clone's flags are its first argument on x86_64 (the filter
    # refuses every other arch); clone3 is ENOSYS; unshare, setns and execve
    # can only make a table private, never shared. No libc, Go, Node, Rust or
    # Java start-up asks for this combination (threads: FILES with THREAD;
    # fork, vfork, posix_spawn: neither).
    rules.append(SyscallRule("clone", errno.EPERM,
                             ((0, CLONE_FILES | CLONE_THREAD, CLONE_FILES),)))
    return rules


def build_filter(allow_unix_sockets: bool, supervised: bool = False):
    """A loaded-later pyseccomp SyscallFilter (default allow)."""
    # ~4 ms, asked only when no filter made at install matches
    # (seccomp_cache.py; the helper imports it through startup.imports first).
    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.ERRNO(errno.ENOSYS))
    for rule in filter_rules(allow_unix_sockets, supervised):
        args = [sc.Arg(i, sc.MASKED_EQ, mask, value) for i, mask, value in rule.args]
        f.add_rule(sc.NOTIFY if rule.notify else sc.ERRNO(rule.errno_), rule.syscall, *args)
    return f


# seccomp(2): SECCOMP_SET_MODE_FILTER and its flags (include/uapi/linux/seccomp.h).
SYS_SECCOMP = 317
SECCOMP_SET_MODE_FILTER = 1
FILTER_FLAG_NEW_LISTENER = 1 << 3
FILTER_FLAG_WAIT_KILLABLE_RECV = 1 << 5     # Linux 5.19


def filter_bpf(allow_unix_sockets: bool, supervised: bool = False) -> bytes:
    """The BPF program libseccomp makes of the rules (what its own load would
    load), made once in the helper: the program's process loads these bytes
    (load_bpf) instead of making them again after go."""
    return _exported_bpf(build_filter(allow_unix_sockets, supervised))


def load_with_listener(bpf: bytes) -> int:
    """Load a filter that has a notify rule, in the calling thread; its listener fd.

    libseccomp 2.5 (Debian 12's) cannot ask for SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
    so the BPF it makes is loaded here with seccomp(2) itself. With that flag,
    once the supervisor has read a notification the program's thread waits
    for its answer, and only a fatal signal ends the wait: a signal can no
    longer make the program give up on a connect() the supervisor then makes
    behind its back (docs/security.md, "Unix sockets by origin"). A kernel
    before 5.19 refuses the flag (EINVAL): the filter is loaded without it."""
    return load_bpf(bpf, listener=True)


def load_bpf(bpf: bytes, listener: bool = False) -> int:
    """Load `bpf` (filter_bpf's) in the calling thread, as libseccomp's own
    load does: no_new_privs, then seccomp(2) with no flag (libseccomp sets
    none by default). With `listener`, the notify listener's fd is returned."""
    if not bpf or len(bpf) % 8:       # sizeof(struct sock_filter)
        raise ValueError(f"not a BPF program ({len(bpf)} bytes)")
    code = (foreign.c_char * len(bpf)).from_buffer_copy(bpf)
    sock_fprog, seccomp = loader()
    prog = sock_fprog(len(bpf) // 8, foreign.addressof(code))
    prctl(PR_SET_NO_NEW_PRIVS, 1)         # as libseccomp does (and the drop did)
    tries = ((FILTER_FLAG_NEW_LISTENER | FILTER_FLAG_WAIT_KILLABLE_RECV, FILTER_FLAG_NEW_LISTENER)
             if listener else (0,))
    for flags in tries:
        fd = seccomp(SYS_SECCOMP, SECCOMP_SET_MODE_FILTER, flags, foreign.addressof(prog))
        if fd >= 0:
            return fd
        err = foreign.get_errno()
        if err != errno.EINVAL:
            break
    raise OSError(err, f"seccomp(SECCOMP_SET_MODE_FILTER): {os.strerror(err)}")


_LOADER = None
_LIBSECCOMP = None


class _Version(NamedTuple):
    major: int
    minor: int
    micro: int


def libseccomp_version() -> tuple[_Version, int]:
    """libseccomp's version and the API level it finds in this kernel,
    asked of the library itself through `_ctypes` (stages/kernel/foreign.py;
    pyseccomp's import, ~4 ms, is then needed only when a filter is made:
    seccomp_cache.py). Raises OSError when the library cannot be loaded,
    AttributeError when it is too old to say."""
    global _LIBSECCOMP
    if _LIBSECCOMP is None:
        class Version(foreign.Structure):
            _fields_ = [("major", foreign.c_uint), ("minor", foreign.c_uint), ("micro", foreign.c_uint)]
        library = foreign.Library("libseccomp.so.2")
        _LIBSECCOMP = (library.function("seccomp_version", (), restype=foreign.POINTER(Version)),
                       library.function("seccomp_api_get", (), restype=foreign.c_uint))
    seccomp_version, seccomp_api_get = _LIBSECCOMP
    version = seccomp_version().contents
    return (_Version(version.major, version.minor, version.micro), int(seccomp_api_get()))


def loader():
    """struct sock_fprog and seccomp(2) through libc's syscall(), made once
    (`_ctypes` alone, stages/kernel/foreign.py): the helper makes them while
    building the filter, and the program's process (forked from init, forked
    from the helper) finds them made."""
    global _LOADER
    if _LOADER is None:
        class SockFprog(foreign.Structure):
            _fields_ = [("len", foreign.c_ushort), ("filter", foreign.c_void_p)]
        seccomp = foreign.libc().function("syscall", (foreign.c_long, foreign.c_uint, foreign.c_uint,
                                            foreign.c_void_p), restype=foreign.c_long)
        _LOADER = (SockFprog, seccomp)
    return _LOADER


def _exported_bpf(seccomp_filter) -> bytes:
    """The BPF program libseccomp makes of the filter (what its own load would load)."""
    fd = os.memfd_create("vpnw-seccomp-bpf", os.MFD_CLOEXEC)
    try:
        class _Fd:
            def fileno(self) -> int:
                return fd
        seccomp_filter.export_bpf(_Fd())
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)

"""Pure: what the Unix-socket supervisor answers one notified call.

The supervisor (shell.py here, and its compiled fast path fast_continue.c)
reads what it needs of a notified call — the call itself, the thread's socket, the address, the file a path names — and
`decide` turns what was read into the answer: no I/O here, so the tests feed
it made-up calls (tests/test_supervisor_differential.py feeds the compiled
path the same ones, behind a mock of its system calls, and requires the
same answers). The argument is docs/security.md, "Unix sockets by origin".

`call` is anything with the attributes Call has; decide reads only those it
needs, in the order the supervisor may read them (the shell computes each
on first use: the thread group is counted before the socket is taken).
"""
from __future__ import annotations

import errno
import socket

from stages.startup.records import NamedTuple  # typing's, without importing typing

AF_UNIX = socket.AF_UNIX
UNIX_FAMILY = AF_UNIX.to_bytes(2, "little")     # a sockaddr's first two bytes, for AF_UNIX
SUN_PATH_AT = 2                 # offsetof(struct sockaddr_un, sun_path)
SOCKADDR_UN_MAX = 110           # sizeof(struct sockaddr_un)
SOCKADDR_MAX = 128              # sizeof(struct sockaddr_storage): the kernel's limit
INET_FAMILIES = frozenset({socket.AF_INET, socket.AF_INET6})

# The calls the filter sends (stages/helper/seccomp_rules.py), as x86_64
# numbers them: the filter refuses every other architecture (ENOSYS) before
# any rule, so a notification of another arch or call is not one of ours.
AUDIT_ARCH_X86_64 = 0xC000003E
SYS_CONNECT, SYS_LISTEN = 42, 50
NOTIFIED = frozenset({SYS_CONNECT, SYS_LISTEN})

# Why a connect was refused, as the record says it (docs/record.md, unix.deny).
OUTSIDE_PATH = "a socket bound outside the sandbox"
THROUGH_PROC = "a path through a /proc link"
ABSTRACT_OUTSIDE = "an abstract socket from a socket made outside the sandbox"
MADE_OUTSIDE = "a socket made outside the sandbox"
NO_IDENTITY = "a socket file on a file system whose inode numbers can repeat"


class UnixDestination(NamedTuple):
    kind: str          # "path" | "abstract" | "invalid"
    name: bytes        # the path, or the abstract name with its leading NUL


def unix_destination(raw: bytes) -> UnixDestination:
    """What a sockaddr_un asks for, read as the kernel reads it
    (unix_validate_addr, unix_mkname_bsd): a path ends at the first NUL or
    at the address's end; an abstract name is every byte after sun_path[0]."""
    if not SUN_PATH_AT < len(raw) <= SOCKADDR_UN_MAX or int.from_bytes(raw[:2], "little") != AF_UNIX:
        return UnixDestination("invalid", b"")
    sun_path = raw[SUN_PATH_AT:]
    if sun_path[0] == 0:
        return UnixDestination("abstract", sun_path)
    return UnixDestination("path", sun_path.split(b"\0", 1)[0])


_LOOPBACK_V4 = bytes([127, 0, 0, 1])
_LOOPBACK_V6 = (bytes(15) + b"\1", bytes(10) + b"\xff\xff" + _LOOPBACK_V4)


def loopback_port(raw: bytes) -> int | None:
    """The port a sockaddr_in / sockaddr_in6 asks for when its address is
    127.0.0.1 or ::1 (or ::ffff:127.0.0.1); None for anything else."""
    family = int.from_bytes(raw[:2], "little") if len(raw) >= 2 else None
    if family == socket.AF_INET and len(raw) >= 8 and raw[4:8] == _LOOPBACK_V4:
        return int.from_bytes(raw[2:4], "big")
    if family == socket.AF_INET6 and len(raw) >= 24 and raw[8:24] in _LOOPBACK_V6:
        return int.from_bytes(raw[2:4], "big")
    return None


def has_listener(listened, port: int) -> bool:
    """Is `port`'s bit set in the bitmap of loopback ports seen with a listener?"""
    return bool(listened[port >> 3] >> (port & 7) & 1)


def int32(value: int) -> int:
    """A register's low 32 bits as the kernel reads an int argument."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


class ConnectTarget(NamedTuple):
    """The file a Unix path names, as the program's thread finds it."""
    error: int = 0          # the errno its lookup gave (EXDEV: through /proc's links)
    socket: bool = False    # a socket file (S_ISSOCK)
    key: tuple | None = None   # its identity (identity_key); None: none that cannot repeat


class Call(NamedTuple):
    """What decide reads of one notification (the shell's is lazy, with the same names)."""
    nr: int = SYS_CONNECT
    arch: int = AUDIT_ARCH_X86_64
    pid: int = 1                # the notifying thread (seccomp_notif.pid, a u32)
    alone: bool = False         # the only thread of its group (counted before the take)
    sock_error: int = 0         # the errno taking its fd gave (pidfd_getfd)
    length: int = 0             # args[2] as the kernel reads it (an int)
    raw_error: int = 0          # the errno reading the address gave
    raw: bytes = b""            # the address, read once
    domain: int | None = None   # the socket's SO_DOMAIN; None: no socket (ENOTSOCK)
    made_inside: bool = False   # its network namespace is the sandbox's (SO_NETNS_COOKIE)
    target: ConnectTarget = ConnectTarget()   # for a Unix path: the file it names


class Sandbox(NamedTuple):
    """What the supervisor knows of the sandbox: the loopback ports seen with
    a listener (a bitmap), the identities of the socket files its programs
    bound (recorded at listen()), and those of the sockets the policy names."""
    listened: bytes | bytearray
    bound: dict | set | frozenset
    named: dict


class ConnectAnswer(NamedTuple):
    action: str         # one of the names below
    errno: int = 0      # ERRNO, REFUSE: what the program's call returns
    why: str = ""       # REFUSE: the record's reason; CONNECT_TARGET: the policy's entry, if it named it


GO_ON = "go-on"                     # the kernel runs the program's own call (CONTINUE)
LISTEN = "listen"                   # record the socket's file, then go on
CONNECT = "connect"                 # connect the socket taken to the bytes read
CONNECT_TARGET = "connect-target"   # connect it through the fd of the file checked
ERRNO = "errno"                     # answer this errno (what the kernel itself would say)
REFUSE = "refuse"                   # EPERM, and the record says why

_GO_ON = ConnectAnswer(GO_ON)
_CONNECT = ConnectAnswer(CONNECT)
NOT_OURS = ConnectAnswer(ERRNO, errno.EPERM)      # a call, arch or thread the filter never sends


def _errno(value: int) -> ConnectAnswer:
    return ConnectAnswer(ERRNO, value)


def _refuse(why: str) -> ConnectAnswer:
    return ConnectAnswer(REFUSE, errno.EPERM, why)


def decide(call, sandbox: Sandbox) -> ConnectAnswer:
    """The answer to one notified call (docs/security.md, "Unix sockets by origin")."""
    if call.arch != AUDIT_ARCH_X86_64 or call.nr not in NOTIFIED or int32(call.pid) <= 0:
        return NOT_OURS
    if call.nr == SYS_LISTEN:
        return ConnectAnswer(LISTEN)
    if call.sock_error:
        return _errno(call.sock_error)
    if not 0 <= call.length <= SOCKADDR_MAX:
        return _errno(errno.EINVAL)
    if call.raw_error:
        return _errno(call.raw_error)
    raw = call.raw
    domain = call.domain
    if domain is None:
        return _errno(errno.ENOTSOCK)
    # A socket of another family made outside (passed in over SCM_RIGHTS)
    # would connect from the network namespace it was made in.
    if domain != AF_UNIX and not call.made_inside:
        return _refuse(MADE_OUTSIDE)
    if raw[:SUN_PATH_AT] != UNIX_FAMILY or domain != AF_UNIX:
        # Another family (TCP, UDP, netlink): connected as asked, the
        # network namespace is that boundary; on a Unix socket the kernel
        # refuses such an address itself (EINVAL), and a Unix address on
        # another socket (EAFNOSUPPORT). A thread alone in its group may go
        # on with an IP connect, but for a loopback port no listener was
        # seen on: that one is made here, its refusal evidence for a hint.
        if call.alone and domain in INET_FAMILIES and raw[:SUN_PATH_AT] != UNIX_FAMILY:
            port = loopback_port(raw)
            if port is None or has_listener(sandbox.listened, port):
                return _GO_ON
        return _CONNECT
    destination = unix_destination(raw)
    if destination.kind == "invalid":
        return _errno(errno.EINVAL)
    if destination.kind == "abstract":
        return _CONNECT if call.made_inside else _refuse(ABSTRACT_OUTSIDE)
    target = call.target
    if target.error == errno.EXDEV:
        return _refuse(THROUGH_PROC)
    if target.error:
        return _errno(target.error)
    if not target.socket:
        return _errno(errno.ECONNREFUSED)   # what connect() says for a file that is no socket
    if target.key is None:
        return _refuse(NO_IDENTITY)
    if target.key in sandbox.named:
        return ConnectAnswer(CONNECT_TARGET, why=sandbox.named[target.key])
    if target.key in sandbox.bound:
        return ConnectAnswer(CONNECT_TARGET)
    return _refuse(OUTSIDE_PATH)


def reports_refusal(port: int, listened) -> bool:
    """Is a refused connect to the loopback's `port` evidence for a hint?
    Not when a listener was seen there (the doors, the program's own
    servers): the compiled path lets those connects go on, or makes them,
    and reports nothing, so neither does the Python path."""
    return not has_listener(listened, port)


# File systems whose inode numbers repeat among live files (a 32-bit
# counter that wraps: tmpfs without inode64, ramfs and the other
# get_next_ino() ones) or are whatever a server says (FUSE): a file there
# is told apart by its handle alone (f_type, include/uapi/linux/magic.h).
INODES_MAY_REPEAT = frozenset({
    0x01021994,     # TMPFS_MAGIC
    0x858458F6,     # RAMFS_MAGIC
    0x958458F6,     # HUGETLBFS_MAGIC
    0x65735546,     # FUSE_SUPER_MAGIC
    0x1CD1,         # DEVPTS_SUPER_MAGIC
    0x19800202,     # MQUEUE_MAGIC
    0x64626720,     # DEBUGFS_MAGIC
    0x74726163,     # TRACEFS_MAGIC
    0x62656570,     # CONFIGFS_MAGIC
    0x73636673,     # SECURITYFS_MAGIC
    0xCAFE4A11,     # BPF_FS_MAGIC
})


def identity_key(dev: int, ino: int, handle: tuple[int, bytes] | None, fs_type: int) -> tuple | None:
    """A socket file's identity, which no other file ever has: its file
    system's device and its file handle (the inode and its generation, what
    NFS names a file by across reboots). Without a handle, its inode number,
    but only on a file system whose numbers cannot repeat; None (no
    identity: never matched) on one whose can."""
    if handle is not None:
        return ("handle", dev, handle[0], handle[1])
    if fs_type in INODES_MAY_REPEAT:
        return None
    return ("inode", dev, ino)

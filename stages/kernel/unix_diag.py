"""The Unix listeners of a network namespace, by the file each is bound to (sock_diag).

A Unix socket belongs to the network namespace it was made in; NETLINK_SOCK_DIAG
dumps only the sockets of the namespace the asking netlink socket was made in.
With UDIAG_SHOW_VFS each bound socket comes with the device and inode of its
socket file, which is what a path-based connect() finds it by
(docs/security.md, "Unix sockets"). `dump_request` and `parse_listeners` are
sans-I/O; `listening_files` is the shell.

Layouts: include/uapi/linux/sock_diag.h, unix_diag.h, netlink.h.
"""
from __future__ import annotations

import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
UDIAG_SHOW_VFS = 0x2
UNIX_DIAG_VFS = 1

_NLMSGHDR = struct.Struct("=IHHII")
# struct unix_diag_req {u8 family, protocol; u16 pad; u32 states, ino, show; u32 cookie[2]}
_REQ = struct.Struct("=BBHIII2I")
# struct unix_diag_msg {u8 family, type, state, pad; u32 ino; u32 cookie[2]}
_MSG = struct.Struct("=BBBBI2I")
_RTATTR = struct.Struct("=HH")
_VFS = struct.Struct("=II")          # udiag_vfs_ino, udiag_vfs_dev


class DiagError(Exception):
    """The kernel's answer was not a sock_diag dump we can read."""


def dump_request(seq: int) -> bytes:
    body = _REQ.pack(socket.AF_UNIX, 0, 0, 1 << TCP_LISTEN, 0, UDIAG_SHOW_VFS, 0, 0)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY,
                          NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def stat_dev(kernel_dev: int) -> int:
    """The kernel's internal dev_t (major << 20 | minor), as sock_diag reports
    it, in stat(2)'s encoding, so it compares with st_dev."""
    return os.makedev(kernel_dev >> 20, kernel_dev & 0xFFFFF)


def _align(n: int) -> int:
    return (n + 3) & ~3


def parse_listeners(data: bytes) -> tuple[set[tuple[int, int]], bool]:
    """One read's worth of the dump -> ({(st_dev, low 32 bits of st_ino)} of
    the listeners bound to a file, whether the dump is over). DiagError on an
    error message or a malformed one."""
    found: set[tuple[int, int]] = set()
    offset, done = 0, False
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            raise DiagError(f"a netlink message of length {length}")
        body = data[offset + _NLMSGHDR.size:offset + length]
        offset += _align(length)
        if kind == NLMSG_DONE:
            done = True
            break
        if kind == NLMSG_ERROR:
            code = struct.unpack_from("=i", body)[0] if len(body) >= 4 else -1
            if code == 0:
                continue
            raise DiagError(f"sock_diag refused the dump: {os.strerror(-code)}")
        if kind != SOCK_DIAG_BY_FAMILY or len(body) < _MSG.size:
            raise DiagError(f"an unexpected netlink message of type {kind}")
        vfs = _vfs_of(body[_MSG.size:])
        if vfs is not None:
            ino, dev = vfs
            found.add((stat_dev(dev), ino))
    return found, done


def _vfs_of(attrs: bytes) -> tuple[int, int] | None:
    offset = 0
    while offset + _RTATTR.size <= len(attrs):
        length, kind = _RTATTR.unpack_from(attrs, offset)
        if length < _RTATTR.size:
            raise DiagError(f"a netlink attribute of length {length}")
        if kind == UNIX_DIAG_VFS and length >= _RTATTR.size + _VFS.size:
            return _VFS.unpack_from(attrs, offset + _RTATTR.size)
        offset += _align(length)
    return None


def open_diag() -> socket.socket:
    """A sock_diag socket; it answers for the network namespace of the
    process that makes it, for as long as it lives."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                         NETLINK_SOCK_DIAG)


def listening_files(diag: socket.socket, seq: int = 1) -> set[tuple[int, int]]:
    """(st_dev, st_ino & 0xffffffff) of every listening Unix socket bound to a
    file in `diag`'s network namespace."""
    diag.send(dump_request(seq))
    found: set[tuple[int, int]] = set()
    while True:
        data = diag.recv(65536)
        if not data:
            raise DiagError("sock_diag closed the dump")
        part, done = parse_listeners(data)
        found |= part
        if done:
            return found

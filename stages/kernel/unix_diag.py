"""The Unix listeners of a network namespace, by the file each is bound to (sock_diag).

A Unix socket belongs to the network namespace it was made in; NETLINK_SOCK_DIAG
dumps only the sockets of the namespace the asking netlink socket was made in.
With UDIAG_SHOW_VFS each bound socket comes with the device and the low 32
bits of the inode number of its socket file: not an identity (numbers
repeat), only enough for the supervisor to tell which of the socket files
it recorded still have a listener (docs/security.md, "Unix sockets by
origin"). `dump_request` and `parse_listeners` are
sans-I/O (the walk over the dump is sock_diag.py's); `listening_files` is
the shell.

Layouts: include/uapi/linux/sock_diag.h, unix_diag.h, netlink.h.
"""
from __future__ import annotations

import os
import socket
import struct

from stages.kernel.sock_diag import (NLMSG_DONE, NLMSG_ERROR, SOCK_DIAG_BY_FAMILY,  # noqa: F401
                                     TCP_LISTEN, DiagError, align, dump_message, open_diag,
                                     read_dump, sock_diag_messages)

UDIAG_SHOW_VFS = 0x2
UNIX_DIAG_VFS = 1

# struct unix_diag_req {u8 family, protocol; u16 pad; u32 states, ino, show; u32 cookie[2]}
_REQ = struct.Struct("=BBHIII2I")
# struct unix_diag_msg {u8 family, type, state, pad; u32 ino; u32 cookie[2]}
_MSG = struct.Struct("=BBBBI2I")
_RTATTR = struct.Struct("=HH")
_VFS = struct.Struct("=II")          # udiag_vfs_ino, udiag_vfs_dev


def dump_request(seq: int) -> bytes:
    return dump_message(_REQ.pack(socket.AF_UNIX, 0, 0, 1 << TCP_LISTEN, 0, UDIAG_SHOW_VFS,
                                  0, 0), seq)


def stat_dev(kernel_dev: int) -> int:
    """The kernel's internal dev_t (major << 20 | minor), as sock_diag reports
    it, in stat(2)'s encoding, so it compares with st_dev."""
    return os.makedev(kernel_dev >> 20, kernel_dev & 0xFFFFF)


def parse_listeners(data: bytes) -> tuple[set[tuple[int, int]], bool]:
    """One read's worth of the dump -> ({(st_dev, low 32 bits of st_ino)} of
    the listeners bound to a file, whether the dump is over). DiagError on an
    error message or a malformed one."""
    found: set[tuple[int, int]] = set()
    for body in sock_diag_messages(data, _MSG.size):
        if body is None:
            return found, True
        vfs = _vfs_of(body[_MSG.size:])
        if vfs is not None:
            ino, dev = vfs
            found.add((stat_dev(dev), ino))
    return found, False


def _vfs_of(attrs: bytes) -> tuple[int, int] | None:
    offset = 0
    while offset + _RTATTR.size <= len(attrs):
        length, kind = _RTATTR.unpack_from(attrs, offset)
        if length < _RTATTR.size:
            raise DiagError(f"a netlink attribute of length {length}")
        if kind == UNIX_DIAG_VFS and length >= _RTATTR.size + _VFS.size:
            return _VFS.unpack_from(attrs, offset + _RTATTR.size)
        offset += align(length)
    return None


def listening_files(diag: socket.socket, seq: int = 1) -> set[tuple[int, int]]:
    """(st_dev, st_ino & 0xffffffff) of every listening Unix socket bound to a
    file in `diag`'s network namespace."""
    return read_dump(diag, dump_request(seq), parse_listeners)

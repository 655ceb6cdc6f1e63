"""NETLINK_SOCK_DIAG's dump, walked: what unix_diag.py and inet_diag.py share.

A dump is a run of netlink messages: one SOCK_DIAG_BY_FAMILY message per
socket, then NLMSG_DONE; NLMSG_ERROR with a non-zero code is the kernel
refusing. `sock_diag_messages` is the sans-I/O walk over one read's worth of
it, `read_dump` the shell that reads until NLMSG_DONE; each parser keeps only
its own per-message code.

Layouts: include/uapi/linux/netlink.h, sock_diag.h.
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

NLMSGHDR = struct.Struct("=IHHII")      # length, type, flags, seq, pid

# typing only for the annotations: the helper imports this on its way to
# Ready, and typing's import is ~4 ms there.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterator, TypeVar
    T = TypeVar("T")


class DiagError(Exception):
    """The kernel's answer was not a sock_diag dump we can read."""


def align(n: int) -> int:
    return (n + 3) & ~3


def dump_message(body: bytes, seq: int) -> bytes:
    """The netlink request that asks for a dump with this request body."""
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY,
                         NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def sock_diag_messages(data: bytes, min_size: int) -> Iterator[bytes | None]:
    """One read's worth of a dump -> the body of each socket's message (at
    least `min_size` bytes), then None if the dump is over (NLMSG_DONE).
    DiagError on a refusal, an unexpected message or a malformed one."""
    offset = 0
    while offset + NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = NLMSGHDR.unpack_from(data, offset)
        if length < NLMSGHDR.size or offset + length > len(data):
            raise DiagError(f"a netlink message of length {length}")
        body = data[offset + NLMSGHDR.size:offset + length]
        offset += align(length)
        if kind == NLMSG_DONE:
            yield None
            return
        if kind == NLMSG_ERROR:
            code = struct.unpack_from("=i", body)[0] if len(body) >= 4 else -1
            if code == 0:
                continue
            raise DiagError(f"sock_diag refused the dump: {os.strerror(-code)}")
        if kind != SOCK_DIAG_BY_FAMILY or len(body) < min_size:
            raise DiagError(f"an unexpected netlink message of type {kind}")
        yield body


def open_diag() -> socket.socket:
    """A sock_diag socket; it answers for the network namespace of the
    process that makes it, for as long as it lives."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                         NETLINK_SOCK_DIAG)


def read_dump(diag: socket.socket, request: bytes,
              parse: Callable[[bytes], tuple[set[T], bool]]) -> set[T]:
    """Send one dump request and gather `parse`'s findings until the dump is over."""
    diag.send(request)
    found: set[T] = set()
    while True:
        data = diag.recv(65536)
        if not data:
            raise DiagError("sock_diag closed the dump")
        part, done = parse(data)
        found |= part
        if done:
            return found

"""The helper -> broker link: accepted connections handed over as file descriptors.

The link is an AF_UNIX SOCK_SEQPACKET socketpair. The helper shares a namespace
with the program it guards, so the broker treats every message as untrusted
(OpenSSH privsep style): one message is exactly two bytes, b"C" and a door id,
carrying exactly one file descriptor that must be a connected TCP stream
socket. Anything else is a HandoffError and the broker drops the message and
closes whatever descriptors came with it.
"""
from __future__ import annotations

import array
import os
import socket

DOORS = {"http": 3128, "socks": 1080}
_DOOR_BYTE = {"http": b"H", "socks": b"S"}
_BYTE_DOOR = {v: k for k, v in _DOOR_BYTE.items()}
MESSAGE_SIZE = 2


class HandoffError(Exception):
    pass


def link() -> tuple[socket.socket, socket.socket]:
    """(helper_end, broker_end)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send_conn(sock: socket.socket, door: str, fd: int) -> None:
    sock.sendmsg([b"C" + _DOOR_BYTE[door]],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def recv_conn(sock: socket.socket) -> tuple[str, socket.socket] | None:
    """Next handed-over connection as (door, socket); None at end of stream.

    Raises HandoffError for a message that breaks the protocol (its fds are
    closed first, so a hostile helper cannot leak descriptors into the broker).
    """
    fds = array.array("i")
    msg, ancdata, flags, _ = sock.recvmsg(16, socket.CMSG_SPACE(4 * fds.itemsize))
    for level, type_, data in ancdata:
        if level == socket.SOL_SOCKET and type_ == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if not msg and not fds:
        return None
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise HandoffError("truncated message")
        if len(msg) != MESSAGE_SIZE or msg[:1] != b"C" or msg[1:2] not in _BYTE_DOOR:
            raise HandoffError(f"unexpected message {msg[:16]!r}")
        if len(fds) != 1:
            raise HandoffError(f"expected one descriptor, got {len(fds)}")
        try:
            conn = socket.socket(fileno=fds[0])
        except OSError:
            # A pipe or a file: refused like any other bad message, never
            # taken for a failure of the link itself.
            raise HandoffError("descriptor is not a socket") from None
        fds = array.array("i")  # owned by conn now
        if conn.type != socket.SOCK_STREAM or conn.family not in (socket.AF_INET, socket.AF_INET6):
            conn.close()
            raise HandoffError("descriptor is not a TCP stream socket")
        return _BYTE_DOOR[msg[1:2]], conn
    finally:
        for fd in fds:
            os.close(fd)

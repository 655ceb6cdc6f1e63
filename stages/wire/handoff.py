"""The helper -> broker link: the doors, handed over as file descriptors.

The link is an AF_UNIX SOCK_SEQPACKET socketpair. The helper hands over each
door's listening socket once, before the program starts, and the broker
accepts on it itself: a connection costs the broker one accept(2) and the
helper nothing (the helper used to accept each one and pass it on, which
cost both processes a wake-up and four system calls a connection). A socket
keeps its network namespace wherever its descriptor goes, so what the
broker accepts are still connections made on the sandbox's own loopback.

The helper shares a namespace with the program it guards, so the broker
treats every message as untrusted (OpenSSH privsep style): one message is
exactly two bytes, a kind and a door id, carrying exactly one file
descriptor:

    b"L" + door   a door's listening socket: TCP, listening (SO_ACCEPTCONN)
    b"C" + door   one accepted connection: a connected TCP stream socket
    b"U" + b"D"   the DNS door's UDP socket: bound, not connected

(a helper that accepted a connection itself, and the tests, use b"C").
Anything else is a HandoffError and the broker drops the message and closes
whatever descriptors came with it.
"""
from __future__ import annotations

import array
import os
import socket

from stages.startup.records import NamedTuple  # typing's, without importing typing

DOORS = {"http": 3128, "socks": 1080}
# With capture (docs/architecture.md "Capture"): every TCP connection the
# program opens to an address that is not the sandbox's loopback is
# redirected to this door, on 127.0.0.1 and ::1.
CAPTURE_DOORS = {"capture": 1081, "dns": 53}
# The DNS door (with capture): the resolver /etc/resolv.conf names inside,
# UDP and TCP. Its TCP listener goes over like a door; its UDP socket as
# b"U" + b"D" (a bound datagram socket).
DNS_PORT = 53
# A `localhost:PORT` allow rule: a door on that port of the sandbox's
# loopback, forwarded to the same port on the machine's (its port is the
# listening socket's own).
# A secret door (docs/secrets.md): one per secret, on its own port (the
# broker knows which secret by the listening socket's port).
_DOOR_BYTE = {"http": b"H", "socks": b"S", "capture": b"T", "dns": b"D", "local": b"O", "secret": b"K"}
_BYTE_DOOR = {v: k for k, v in _DOOR_BYTE.items()}
_KINDS = {b"L": "door", b"C": "conn", b"U": "datagram"}
MESSAGE_SIZE = 2


def doors(capture: bool = False) -> dict[str, int]:
    """The doors a run opens, door -> port."""
    return {**DOORS, **CAPTURE_DOORS} if capture else dict(DOORS)


class HandoffError(Exception):
    pass


class Handed(NamedTuple):
    kind: str              # "door" (a listening socket) or "conn" (one connection)
    door: str              # "http", "socks" or "capture"
    sock: socket.socket


def link() -> tuple[socket.socket, socket.socket]:
    """(helper_end, broker_end)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def _send(sock: socket.socket, kind: bytes, door: str, fd: int) -> None:
    sock.sendmsg([kind + _DOOR_BYTE[door]],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def send_door(sock: socket.socket, door: str, fd: int) -> None:
    """Hand over `door`'s listening socket."""
    _send(sock, b"L", door, fd)


def send_datagram_door(sock: socket.socket, fd: int) -> None:
    """Hand over the DNS door's UDP socket."""
    _send(sock, b"U", "dns", fd)


def send_conn(sock: socket.socket, door: str, fd: int) -> None:
    """Hand over one connection accepted on `door`."""
    _send(sock, b"C", door, fd)


def receive(sock: socket.socket) -> Handed | None:
    """The next door or connection handed over; None at end of stream.

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
        if len(msg) != MESSAGE_SIZE or msg[:1] not in _KINDS or msg[1:2] not in _BYTE_DOOR:
            raise HandoffError(f"unexpected message {msg[:16]!r}")
        if len(fds) != 1:
            raise HandoffError(f"expected one descriptor, got {len(fds)}")
        try:
            handed = socket.socket(fileno=fds[0])
        except OSError:
            # A pipe or a file: refused like any other bad message, never
            # taken for a failure of the link itself.
            raise HandoffError("descriptor is not a socket") from None
        fds = array.array("i")  # owned by `handed` now
        kind = _KINDS[msg[:1]]
        problem = _problem(handed, kind)
        if problem is None and kind == "datagram" and msg[1:2] != b"D":
            problem = "only the DNS door hands over a UDP socket"
        if problem:
            handed.close()
            raise HandoffError(problem)
        return Handed(kind, _BYTE_DOOR[msg[1:2]], handed)
    finally:
        for fd in fds:
            os.close(fd)


class Pending(NamedTuple):
    handed: list[Handed]    # in the order they came
    problems: list[str]     # messages dropped, or the link failing, in words
    ended: bool             # the helper's end closed (or the link failed)


def take_pending(sock: socket.socket, most: int | None = None) -> Pending:
    """What the (non-blocking) link holds now, at most `most` messages: the
    good ones handed, the bad ones dropped and said, and whether it ended."""
    handed, problems = [], []
    while most is None or len(handed) + len(problems) < most:
        try:
            got = receive(sock)
        except (BlockingIOError, InterruptedError):
            break
        except HandoffError as exc:
            problems.append(f"dropped a bad handoff message: {exc}")
            continue
        except OSError as exc:
            problems.append(f"handoff socket failed: {exc}")
            return Pending(handed, problems, True)
        if got is None:
            return Pending(handed, problems, True)
        handed.append(got)
    return Pending(handed, problems, False)


def _problem(sock: socket.socket, kind: str) -> str | None:
    if kind == "datagram":
        if sock.type != socket.SOCK_DGRAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return "a datagram door's descriptor is not a UDP socket"
        return None
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return "descriptor is not a TCP stream socket"
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    if kind == "door" and not listening:
        return "a door's descriptor is not a listening socket"
    if kind == "conn" and listening:
        return "a connection's descriptor is a listening socket"
    return None

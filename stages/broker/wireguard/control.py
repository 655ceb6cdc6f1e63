"""The control channel between the broker's WireGuard dialer and the path
process (a SOCK_SEQPACKET pair, one message per packet), as types.

broker -> path process: the tunnel (JSON, once, first); then `SocketRequest`
(b"t4" b"t6" b"u4" b"u6"; b"T4" b"T6" asks for a batch of TCP sockets) or
`HealthQuestion` (b"h").
path process -> broker: the start answer, `Up` (b"ok") or `Down` (b"down " +
why); then, to each request, `Sockets` (b"s" with the sockets as SCM_RIGHTS),
`Down` (b"e down " + why), `Up` (b"e up", to a health question) or `ControlRefused`
(b"e " + why).

Both sides decode with the functions here; anything else raises ControlError,
so neither side reads the other's bytes by prefixes of its own.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

MAX_REASON = 4000     # bytes of a reason on the wire


class ControlError(ValueError):
    """A control message that is not one of the kinds above."""


@dataclass(frozen=True)
class SocketRequest:
    family: int            # socket.AF_INET or AF_INET6
    stream: bool           # TCP (True) or UDP
    batch: bool = False    # TCP only: up to SOCKET_BATCH sockets in one answer


@dataclass(frozen=True)
class HealthQuestion:
    pass


@dataclass(frozen=True)
class Up:
    pass


@dataclass(frozen=True)
class Down:
    reason: str


@dataclass(frozen=True)
class ControlRefused:
    reason: str


@dataclass(frozen=True)
class Sockets:
    fds: tuple[int, ...]


_FAMILY_DIGIT = {socket.AF_INET: b"4", socket.AF_INET6: b"6"}


def _reason(text: str) -> bytes:
    return text.encode("utf-8", "replace")[:MAX_REASON]


def encode_request(request: SocketRequest | HealthQuestion) -> bytes:
    if isinstance(request, HealthQuestion):
        return b"h"
    letter = (b"T" if request.batch else b"t") if request.stream else b"u"
    return letter + _FAMILY_DIGIT[request.family]


def decode_request(data: bytes) -> SocketRequest | HealthQuestion:
    if data == b"h":
        return HealthQuestion()
    if len(data) == 2 and data[:1] in (b"t", b"T", b"u") and data[1:] in (b"4", b"6"):
        family = socket.AF_INET if data[1:] == b"4" else socket.AF_INET6
        return SocketRequest(family, stream=data[:1] != b"u", batch=data[:1] == b"T")
    raise ControlError(f"unknown request {data[:16]!r}")


def encode_start(answer: Up | Down) -> bytes:
    return b"ok" if isinstance(answer, Up) else b"down " + _reason(answer.reason)


def decode_start(data: bytes) -> Up | Down:
    if data == b"ok":
        return Up()
    if data.startswith(b"down "):
        return Down(data[5:].decode("utf-8", "replace"))
    raise ControlError(f"not a start answer: {data[:16]!r}")


def encode_reply(reply: Up | Down | ControlRefused) -> bytes:
    """The text replies; `Sockets` goes as b"s" with the descriptors attached."""
    if isinstance(reply, Up):
        return b"e up"
    if isinstance(reply, Down):
        return b"e down " + _reason(reply.reason)
    return b"e " + _reason(reply.reason)


def decode_reply(data: bytes, fds: list[int]) -> Sockets | Up | Down | ControlRefused:
    """A reply and the descriptors that came with it (closed here unless they
    are the answer)."""
    if data == b"s" and fds:
        return Sockets(tuple(fds))
    for fd in fds:
        socket.close(fd)
    if data == b"e up":
        return Up()
    if data.startswith(b"e down"):
        return Down(data[7:].decode("utf-8", "replace"))
    if data.startswith(b"e "):
        return ControlRefused(data[2:].decode("utf-8", "replace"))
    raise ControlError(f"not a reply: {data[:16]!r}")


def tunnel_message(wg, private_key: bytes) -> dict:
    """The tunnel as the control socket's first message (pure)."""
    return {"private_key": private_key.hex(), "public_key": wg.public_key.hex(),
            "preshared_key": wg.preshared_key.hex() if wg.preshared_key else None,
            "endpoint_host": wg.endpoint_host, "endpoint_port": wg.endpoint_port,
            "endpoint": wg.endpoint, "addresses": [str(a) for a in wg.addresses],
            "allowed_ips": [str(n) for n in wg.allowed_ips], "mtu": wg.mtu,
            "keepalive": wg.keepalive}

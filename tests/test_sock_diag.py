"""The one walk over a sock_diag dump (stages/kernel/sock_diag.py) and the inet
parser on top of it: sans-I/O, on bytes laid out as the kernel sends them."""
from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from stages.kernel import inet_diag, sock_diag


def _message(kind: int, body: bytes) -> bytes:
    length = 16 + len(body)
    return struct.pack("=IHHII", length, kind, 2, 1, 0) + body + b"\0" * (-length % 4)


def _done() -> bytes:
    return _message(sock_diag.NLMSG_DONE, b"\0" * 4)


def _inet(family: int, state: int, port: int, address: str) -> bytes:
    raw = socket.inet_pton(family, address).ljust(16, b"\0")
    body = struct.pack("=BBBB", family, state, 0, 0) + port.to_bytes(2, "big") + b"\0\0" + raw
    return _message(sock_diag.SOCK_DIAG_BY_FAMILY, body.ljust(72, b"\0"))


def test_the_walk_yields_each_body_then_none_at_done_and_stops_there():
    data = _message(20, b"a" * 8) + _message(20, b"b" * 12) + _done() + _message(20, b"c" * 8)
    assert list(sock_diag.sock_diag_messages(data, 8)) == [b"a" * 8, b"b" * 12, None]


def test_the_walk_without_done_ends_without_none_and_skips_an_ack():
    data = _message(sock_diag.NLMSG_ERROR, struct.pack("=i", 0) + b"\0" * 16) + _message(20, b"x" * 4)
    assert list(sock_diag.sock_diag_messages(data, 4)) == [b"x" * 4]


@pytest.mark.parametrize("data, match", [
    (_message(sock_diag.NLMSG_ERROR, struct.pack("=i", -1) + b"\0" * 16), "refused the dump: "),
    (_message(16, b"\0" * 8), "unexpected netlink message of type 16"),
    (_message(20, b"\0" * 3), "unexpected netlink message of type 20"),
    (struct.pack("=IHHII", 200, 20, 0, 1, 0), "netlink message of length 200"),
])
def test_the_walk_refuses_what_is_not_a_dump(data, match):
    with pytest.raises(sock_diag.DiagError, match=match):
        list(sock_diag.sock_diag_messages(data, 4))


def test_inet_listeners_that_loopback_reaches_are_found_and_others_not():
    data = b"".join((
        _inet(socket.AF_INET, 10, 8080, "127.0.0.1"),
        _inet(socket.AF_INET, 10, 8081, "0.0.0.0"),
        _inet(socket.AF_INET6, 10, 8082, "::"),
        _inet(socket.AF_INET6, 10, 8083, "::ffff:127.0.0.1"),
        _inet(socket.AF_INET, 10, 8084, "10.0.0.1"),        # another address: not reached
        _inet(socket.AF_INET, 1, 8085, "127.0.0.1"),        # established, not listening
    )) + _done()
    assert inet_diag.parse_listeners(data) == ({8080, 8081, 8082, 8083}, True)


def test_a_short_inet_message_is_a_diag_error():
    with pytest.raises(sock_diag.DiagError, match="type 20"):
        inet_diag.parse_listeners(_message(20, b"\0" * 40))


@settings(max_examples=300, deadline=None)
@given(hs.binary(max_size=300))
def test_any_bytes_parse_as_inet_or_raise_diag_error(data):
    try:
        ports, done = inet_diag.parse_listeners(data)
    except sock_diag.DiagError:
        return
    assert isinstance(ports, set) and isinstance(done, bool)

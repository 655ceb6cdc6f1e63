"""The WireGuard path's control channel (stages/broker/wireguard/control.py):
every message round-trips, the bytes are the documented ones, and anything
else is one ControlError."""
from __future__ import annotations

import os
import socket

import pytest
from hypothesis import given, strategies as hs

from stages.broker.wireguard import control as c


@pytest.mark.parametrize("request_, wire", [
    (c.SocketRequest(socket.AF_INET, stream=True), b"t4"),
    (c.SocketRequest(socket.AF_INET6, stream=True), b"t6"),
    (c.SocketRequest(socket.AF_INET, stream=True, batch=True), b"T4"),
    (c.SocketRequest(socket.AF_INET6, stream=False), b"u6"),
    (c.HealthQuestion(), b"h"),
])
def test_requests_round_trip_in_their_documented_bytes(request_, wire):
    assert c.encode_request(request_) == wire
    assert c.decode_request(wire) == request_


@pytest.mark.parametrize("answer", [c.Up(), c.Down("no handshake with 192.0.2.1:51820 within 8 s")])
def test_start_answers_round_trip(answer):
    assert c.decode_start(c.encode_start(answer)) == answer


@pytest.mark.parametrize("reply", [c.Up(), c.Down("wireguard-go stopped"), c.ControlRefused("Too many open files")])
def test_text_replies_round_trip(reply):
    assert c.decode_reply(c.encode_reply(reply), []) == reply


def test_sockets_come_with_their_descriptors_and_stray_ones_are_closed():
    a, b = socket.socketpair()
    assert c.decode_reply(b"s", [a.fileno()]) == c.Sockets((a.fileno(),))
    fd = b.detach()
    assert c.decode_reply(b"e up", [fd]) == c.Up()
    with pytest.raises(OSError):
        os.fstat(fd)          # closed: a reply that carries no socket keeps none
    a.close()


@pytest.mark.parametrize("wire", [b"", b"t", b"t5", b"x4", b"T4 ", b"hh", b"ok"])
def test_unknown_requests_are_refused(wire):
    with pytest.raises(c.ControlError):
        c.decode_request(wire)


@given(hs.binary(max_size=64))
def test_any_bytes_decode_to_a_message_or_one_error(data):
    for decode in (c.decode_request, c.decode_start, lambda d: c.decode_reply(d, [])):
        try:
            decode(data)
        except c.ControlError:
            pass


def test_a_long_reason_is_capped_on_the_wire():
    assert len(c.encode_start(c.Down("x" * 10_000))) <= len(b"down ") + c.MAX_REASON

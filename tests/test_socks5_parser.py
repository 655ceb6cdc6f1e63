"""SOCKS5 door parser: byte by byte, every split point, and fuzzed."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.broker import socks5
from stages.broker.socks5 import (
    NEED_DATA, ConnectRequest, Greeted, NoAcceptableMethod, Socks5Error, SocksRefused, Socks5Parser,
)


def run(raw: bytes, splits=()):
    p = Socks5Parser()
    events = []
    cuts = [0, *sorted(splits), len(raw)]
    for a, b in zip(cuts, cuts[1:]):
        p.feed(raw[a:b])
        while not events or not isinstance(events[-1], (ConnectRequest, SocksRefused, NoAcceptableMethod)):
            ev = p.next_event()
            if ev is NEED_DATA:
                break
            events.append(ev)
    return p, events


GREETING = b"\x05\x02\x02\x00"
V4 = GREETING + b"\x05\x01\x00\x01" + bytes([127, 0, 0, 1]) + struct.pack("!H", 8080)
NAME = GREETING + b"\x05\x01\x00\x03\x0eapi.github.com" + struct.pack("!H", 443) + b"early"
V6 = GREETING + b"\x05\x01\x00\x04" + bytes(15) + b"\x01" + struct.pack("!H", 22)


@pytest.mark.parametrize("raw,expected", [
    (V4, ConnectRequest("127.0.0.1", 8080, socks5.ATYP_IPV4)),
    (NAME, ConnectRequest("api.github.com", 443, socks5.ATYP_DOMAIN)),
    (V6, ConnectRequest("::1", 22, socks5.ATYP_IPV6)),
])
def test_connect_at_every_split_point(raw, expected):
    for cut in [None, *range(1, len(raw))]:
        p, events = run(raw, [] if cut is None else [cut])
        assert events == [Greeted(b"\x05\x00"), expected], cut
    p, events = run(raw, range(1, len(raw)))
    assert events[-1] == expected
    if raw is NAME:
        assert p.early_data() == b"early"


def test_no_acceptable_method():
    p, events = run(b"\x05\x01\x02")
    assert events == [NoAcceptableMethod(b"\x05\xff")]
    p, events = run(b"\x05\x00")
    assert events == [NoAcceptableMethod(b"\x05\xff")]


@pytest.mark.parametrize("command", [socks5.CMD_BIND, socks5.CMD_UDP, 0x09])
def test_bind_and_udp_are_answered_07(command):
    raw = GREETING + bytes([5, command, 0, 1, 127, 0, 0, 1, 0, 80])
    _, events = run(raw)
    assert isinstance(events[-1], SocksRefused)
    assert events[-1].reply[:2] == b"\x05\x07"


def test_unknown_address_type_is_answered_08():
    _, events = run(GREETING + b"\x05\x01\x00\x05")
    assert events[-1].reply[:2] == b"\x05\x08"


@pytest.mark.parametrize("raw", [
    b"\x04\x01\x00\x50\x7f\x00\x00\x01user\x00",     # SOCKS4
    b"GET / HTTP/1.1\r\n\r\n",
    GREETING + b"\x04\x01\x00\x01",                   # request with the wrong version
    GREETING + b"\x05\x01\x01\x01" + bytes(6),        # reserved byte set
    GREETING + b"\x05\x01\x00\x03\x00\x00\x50",       # empty name
    GREETING + b"\x05\x01\x00\x03\x02\xff\xfe\x00\x50",  # not UTF-8
])
def test_malformed_input_raises_protocol_error(raw):
    with pytest.raises(Socks5Error):
        run(raw)


def test_reply_encoding():
    assert socks5.reply(0x02) == b"\x05\x02\x00\x01\x00\x00\x00\x00\x00\x00"
    assert socks5.reply(0, ("10.1.2.3", 4242)) == b"\x05\x00\x00\x01\x0a\x01\x02\x03\x10\x92"
    assert socks5.reply(0, ("::1", 1))[3] == socks5.ATYP_IPV6
    assert len(socks5.reply(0, ("::1", 1))) == 4 + 16 + 2


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([b"\x05", b"\x01", b"\x00", b"\x03", b"\x04", b"\x02",
                                           b"\xff", GREETING, b"\x05\x01\x00"]),
                          st.binary(max_size=20)), max_size=12), st.data())
def test_fuzzed_input_only_raises_protocol_error(parts, data):
    raw = b"".join(parts)
    splits = data.draw(st.lists(st.integers(0, len(raw)), max_size=4))
    try:
        p, events = run(raw, splits)
    except Socks5Error:
        return
    for ev in events:
        if isinstance(ev, ConnectRequest):
            assert 0 <= ev.port <= 65535 and ev.host

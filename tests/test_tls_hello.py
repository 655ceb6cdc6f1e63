"""stages/protocols/tls_hello.py: a real ClientHello read for its server name, the
alert vpnw answers with, and bytes that are not one: one error, never another."""
from __future__ import annotations

import random
import ssl

import pytest

from stages.protocols.tls_hello import (
    ACCESS_DENIED_ALERT, ClientHello, NotClientHello, looks_like_tls, read_client_hello,
)


def client_hello(server_name: str | None, maximum=ssl.TLSVersion.TLSv1_3) -> bytes:
    """What Python's OpenSSL sends first, to `server_name`."""
    context = ssl.create_default_context()
    context.check_hostname = server_name is not None
    context.maximum_version = maximum
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("maximum", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_a_real_client_hello_gives_its_server_name(maximum):
    data = client_hello("evil.example", maximum)
    assert looks_like_tls(data[:2])
    hello = read_client_hello(data)
    assert hello == ClientHello("evil.example", len(data))
    # Byte by byte: "send more" until the last byte, never an error.
    for cut in range(len(data)):
        assert read_client_hello(data[:cut]) is None
    # What follows the ClientHello is not read.
    assert read_client_hello(data + b"\x17\x03\x03garbage") == hello


def test_no_server_name_is_none():
    data = client_hello(None)
    assert read_client_hello(data).server_name is None


def test_a_client_hello_split_over_two_records():
    data = client_hello("api.github.com")
    body = data[5:]
    split = (b"\x16\x03\x01" + (40).to_bytes(2, "big") + body[:40]
             + b"\x16\x03\x01" + (len(body) - 40).to_bytes(2, "big") + body[40:])
    assert read_client_hello(split) == ClientHello("api.github.com", len(split))


@pytest.mark.parametrize("data,why", [
    (b"GET / HTTP/1.1\r\n\r\n", "type 71"),
    (b"\x16\x02\x00\x00\x10", "version 2"),
    (b"\x16\x03\x01\x00\x00", "of 0 bytes"),
    (b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", "not a ClientHello"),
    (b"\x16\x03\x01\x00\x08\x01\x00\x00\x04\x03\x03\x00\x00", "cut short inside"),
])
def test_what_is_not_a_client_hello_says_so(data, why):
    with pytest.raises(NotClientHello, match=why):
        read_client_hello(data)


def test_fuzzed_bytes_raise_one_error_or_none():
    """Mutations of a real ClientHello: a ClientHello, None or NotClientHello,
    never another exception."""
    seed = client_hello("fuzz.example")
    rng = random.Random(44)
    for _ in range(3000):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[:rng.randrange(len(data))]
        try:
            out = read_client_hello(bytes(data))
        except NotClientHello:
            continue
        assert out is None or isinstance(out, ClientHello)
    for _ in range(2000):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        try:
            read_client_hello(b"\x16\x03" + data)
        except NotClientHello:
            pass


def test_the_alert_is_a_fatal_access_denied_that_openssl_reads_as_such():
    """The client side of OpenSSL, fed the alert after its ClientHello,
    reports it in its own words."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="evil.example")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    assert ACCESS_DENIED_ALERT == bytes([21, 3, 3, 0, 2, 2, 49])
    incoming.write(ACCESS_DENIED_ALERT)
    with pytest.raises(ssl.SSLError, match="(?i)alert access denied"):
        tls.do_handshake()

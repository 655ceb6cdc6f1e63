"""Sans-I/O exit clients: SOCKS5 (RFC 1928/1929) and HTTP CONNECT, byte by byte and fuzzed."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.broker.dial import DIAL_ERRORS, DialError
from stages.protocols.proxy_clients import (
    Answered, Authenticated, AuthRefused, Connected, ConnectFailed, ExitProtocolError,
    HttpConnectClient, Send, Socks5Client,
)


def feed_bytewise(client, data: bytes) -> list:
    """Feed one byte at a time, never more than the client asks for."""
    events = []
    for index in range(len(data)):
        assert client.bytes_needed >= 1
        events += client.receive(data[index:index + 1])
    return events


# --- SOCKS5 --------------------------------------------------------------------

def test_socks5_no_auth_connect_to_an_address():
    client = Socks5Client()
    assert client.start() == b"\x05\x01\x00"
    assert client.bytes_needed == 2
    assert feed_bytewise(client, b"\x05\x00") == [Authenticated()]
    assert client.connect("140.82.112.6", 443) == b"\x05\x01\x00\x01\x8c\x52\x70\x06\x01\xbb"
    assert client.bytes_needed == 4
    reply = b"\x05\x00\x00\x01\x7f\x00\x00\x01\x30\x39"
    events = feed_bytewise(client, reply)
    assert events == [Connected("127.0.0.1:12345")]
    assert client.bytes_needed == 0


def test_socks5_name_and_ipv6_targets_are_encoded_as_such():
    client = Socks5Client()
    client.start()
    client.receive(b"\x05\x00")
    assert client.connect("tracker.office.internal", 80) == (
        b"\x05\x01\x00\x03\x17tracker.office.internal\x00\x50")
    other = Socks5Client()
    other.start()
    other.receive(b"\x05\x00")
    assert other.connect("2001:db8::1", 443) == (
        b"\x05\x01\x00\x04" + bytes.fromhex("20010db8000000000000000000000001") + b"\x01\xbb")


def test_socks5_username_password():
    client = Socks5Client("alice", "s3cret")
    assert client.start() == b"\x05\x02\x00\x02"
    assert feed_bytewise(client, b"\x05\x02") == [Send(b"\x01\x05alice\x06s3cret")]
    assert client.bytes_needed == 2
    assert feed_bytewise(client, b"\x01\x00") == [Authenticated()]


def test_socks5_password_refused_and_no_acceptable_method():
    client = Socks5Client("alice", "wrong")
    client.start()
    client.receive(b"\x05\x02")
    [event] = client.receive(b"\x01\x01")
    assert isinstance(event, AuthRefused) and "refused the username/password" in event.message
    anonymous = Socks5Client()
    anonymous.start()
    [event] = anonymous.receive(b"\x05\xff")
    assert isinstance(event, AuthRefused) and "wants credentials" in event.message


@pytest.mark.parametrize("code", range(1, 10))
def test_socks5_failure_codes(code):
    client = Socks5Client()
    client.start()
    client.receive(b"\x05\x00")
    client.connect("10.0.0.1", 22)
    [event] = feed_bytewise(client, bytes([5, code, 0, 1]))
    assert isinstance(event, ConnectFailed) and event.code == code


def test_socks5_domain_bound_address_reads_exactly_the_reply():
    client = Socks5Client()
    client.start()
    client.receive(b"\x05\x00")
    client.connect("example.org", 80)
    reply = b"\x05\x00\x00\x03\x04exit\x00\x50"
    needs, events = [], []
    rest = reply
    while not events:
        need = client.bytes_needed
        needs.append(need)
        events = client.receive(rest[:need])
        rest = rest[need:]
    assert events == [Connected("exit:80")] and rest == b""
    assert needs == [4, 1, 6]


@pytest.mark.parametrize("state_bytes, bad", [
    (b"", b"\x04\x00"),                       # SOCKS4 answer to our greeting
    (b"", b"\x05\x02"),                       # method 2 not offered (no credentials)
    (b"", b"\x05\x01"),                       # GSSAPI not offered
    (b"\x05\x00", b"\x05\x00\x00\x09"),       # unknown address type
    (b"\x05\x00", b"\x04\x00\x00\x01"),       # wrong version in the reply
    (b"\x05\x00", b"\x05\x00\x01\x01"),       # reserved byte set
    (b"\x05\x00", b"\x05\x00\x00\x01\x01\x02\x03\x04\x00\x50extra"),  # bytes past the reply
])
def test_socks5_malformed_replies_raise_the_protocol_error(state_bytes, bad):
    client = Socks5Client()
    client.start()
    if state_bytes:
        client.receive(state_bytes)
        client.connect("10.0.0.1", 80)
    with pytest.raises(ExitProtocolError):
        client.receive(bad)


def test_socks5_data_when_no_reply_is_due():
    client = Socks5Client()
    client.start()
    client.receive(b"\x05\x00")
    with pytest.raises(ExitProtocolError):
        client.receive(b"\x00")


# --- HTTP CONNECT --------------------------------------------------------------

def test_http_connect_request_bytes():
    assert HttpConnectClient().connect("tracker.office.internal", 443) == (
        b"CONNECT tracker.office.internal:443 HTTP/1.1\r\nHost: tracker.office.internal:443\r\n\r\n")
    assert HttpConnectClient("alice", "s3cret").connect("::1", 8443) == (
        b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n"
        b"Proxy-Authorization: Basic YWxpY2U6czNjcmV0\r\n\r\n")


def test_http_connect_refuses_to_build_injected_requests():
    with pytest.raises(ValueError):
        HttpConnectClient().connect("evil\r\nX-Injected: 1", 443)


def test_http_connect_ok_never_reads_past_the_head():
    client = HttpConnectClient()
    client.connect("example.org", 443)
    stream = b"HTTP/1.1 200 Connection established\r\nProxy-Agent: x\r\n\r\nTUNNEL-BYTES"
    events, rest = [], stream
    while not events:
        need = client.bytes_needed
        assert 1 <= need <= 4
        events = client.receive(rest[:need])
        rest = rest[need:]
    assert events == [Connected("")] and rest == b"TUNNEL-BYTES"


def test_http_connect_interim_then_final():
    client = HttpConnectClient()
    client.connect("example.org", 443)
    assert feed_bytewise(client, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\n") == [Connected("")]


@pytest.mark.parametrize("reply, kind, code", [
    (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 3\r\n\r\n", ConnectFailed, 403),
    (b"HTTP/1.1 503 Service Unavailable\r\n\r\n", ConnectFailed, 503),
    (b"HTTP/1.0 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n\r\n", AuthRefused, None),
    (b"HTTP/1.0 401 Unauthorized\r\n\r\n", AuthRefused, None),
])
def test_http_connect_refusals(reply, kind, code):
    client = HttpConnectClient()
    client.connect("example.org", 443)
    [event] = feed_bytewise(client, reply)
    assert isinstance(event, kind)
    if code:
        assert event.code == code


def test_http_probe_is_options_star_with_max_forwards_zero():
    client = HttpConnectClient("a", "b")
    request = client.probe("127.0.0.1", 3128)
    assert request.startswith(b"OPTIONS * HTTP/1.1\r\nHost: 127.0.0.1:3128\r\nMax-Forwards: 0\r\n")
    assert b"Proxy-Authorization: Basic YTpi\r\n" in request
    assert feed_bytewise(client, b"HTTP/1.1 501 Not Implemented\r\n\r\n") == [Answered(501, "Not Implemented")]
    refused = HttpConnectClient("a", "b")
    refused.probe("127.0.0.1", 3128)
    [event] = refused.receive(b"HTTP/1.0 407 Proxy Authentication Required\r\n\r\n")
    assert isinstance(event, AuthRefused) and "refused" in event.message


@pytest.mark.parametrize("reply", [
    b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    b"HTTP/2 200\r\n\r\n",
    b"HTTP/1.1 20 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\nsmuggled",
    b"\x05\x00\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 20000,
])
def test_http_malformed_replies_raise_the_protocol_error(reply):
    client = HttpConnectClient()
    client.connect("example.org", 443)
    with pytest.raises(ExitProtocolError):
        client.receive(reply)


def test_dial_error_codes_are_the_records():
    # One error type for every kind of path, in conn.fail's vocabulary.
    import json
    from pathlib import Path

    import stages
    def conn_fail(node):
        if isinstance(node, dict):
            if "conn.fail" in node:
                return node["conn.fail"]
            return next(filter(None, map(conn_fail, node.values())), None)
        return None

    schema = json.loads((Path(stages.__file__).parent / "record" / "schema.json").read_text())
    record_errors = set(conn_fail(schema)["properties"]["error"]["enum"])
    assert set(DIAL_ERRORS) == record_errors - {"bad-request"}   # bad-request: a handshake's
    assert DialError("path-down", "x").error == "path-down" and str(DialError("dns", "y")) == "y"
    for invented in ("fallback-direct", "bad-reply", "denied-by-exit"):
        with pytest.raises(ValueError):
            DialError(invented, "x")


# --- fuzz: any bytes, any chunking: events or the one protocol error -------------

def drive(client, blob: bytes, cuts: list[int]) -> None:
    position = 0
    for cut in cuts + [len(blob)]:
        chunk = blob[position:max(position, cut)]
        position = max(position, cut)
        try:
            events = client.receive(chunk)
        except ExitProtocolError:
            return
        for event in events:
            if isinstance(event, Authenticated) and isinstance(client, Socks5Client):
                client.connect("example.org", 443)
            assert isinstance(event, (Send, Authenticated, AuthRefused, Connected, ConnectFailed, Answered))
        if client.bytes_needed < 0:
            raise AssertionError("negative bytes_needed")


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=8).map(sorted),
       st.booleans())
def test_fuzz_socks5(blob, cuts, with_auth):
    client = Socks5Client("u", "p") if with_auth else Socks5Client()
    client.start()
    drive(client, blob, cuts)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=300),
                 st.builds(lambda status, tail: b"HTTP/1.1 " + status + tail,
                           st.sampled_from([b"200 OK", b"407 x", b"100 c", b"999", b"2000"]),
                           st.binary(max_size=200))),
       st.lists(st.integers(0, 400), max_size=8).map(sorted), st.booleans())
def test_fuzz_http(blob, cuts, probe):
    client = HttpConnectClient()
    if probe:
        client.probe("127.0.0.1", 3128)
    else:
        client.connect("example.org", 443)
    drive(client, blob, cuts)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=120))
def test_fuzz_socks5_reply_bytewise_with_bytes_needed(tail):
    # Reading exactly bytes_needed at a time never raises anything else, and
    # never asks for zero bytes before an outcome.
    client = Socks5Client()
    client.start()
    client.receive(b"\x05\x00")
    client.connect("10.0.0.1", 80)
    stream = b"\x05" + tail
    try:
        while stream:
            need = client.bytes_needed
            if need == 0:
                break
            events = client.receive(stream[:need])
            stream = stream[need:]
            if events:
                break
    except ExitProtocolError:
        pass

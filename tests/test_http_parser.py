"""HTTP proxy door parser: byte by byte, every split point, and fuzzed."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stages.broker import http_proxy as hp
from stages.broker.http_heads import MAX_BODY_EVENT
from stages.broker.http_proxy import (
    CLOSED, END, NEED_DATA, Body, ConnectHead, ForwardHead, HttpProxyError, RequestParser,
    ResponseHead, ResponseParser,
)


def drain(parser, data: bytes, splits=(), eof=False):
    """Feed `data` cut at `splits`; collect events (Body data merged per message)."""
    events = []
    cuts = [0, *sorted(splits), len(data)]
    pieces = [data[a:b] for a, b in zip(cuts, cuts[1:])]

    def pump():
        while True:
            ev = parser.next_event()
            if ev is NEED_DATA or ev is CLOSED:
                return ev
            if isinstance(ev, Body) and events and isinstance(events[-1], Body):
                events[-1] = Body(events[-1].data + ev.data)
            else:
                events.append(ev)
            if isinstance(ev, ConnectHead):
                return ev

    for piece in pieces:
        parser.feed(piece)
        if isinstance(pump(), ConnectHead):
            return events
    if eof:
        parser.feed_eof()
        last = pump()
        if last is CLOSED:
            events.append(CLOSED)
    return events


def test_connect_head_and_early_tunnel_bytes():
    p = RequestParser()
    events = drain(p, b"CONNECT api.github.com:443 HTTP/1.1\r\nHost: api.github.com:443\r\n"
                      b"Proxy-Authorization: Basic eDp5\r\n\r\n\x16\x03\x01")
    assert events == [ConnectHead("api.github.com", 443, b"HTTP/1.1")]
    assert p.tunnel_data() == b"\x16\x03\x01"


def test_connect_ipv6_literal():
    p = RequestParser()
    assert drain(p, b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n") == [ConnectHead("::1", 8443, b"HTTP/1.1")]


GET = (b"GET http://example.com:8080/a/b?q=1 HTTP/1.1\r\n"
       b"Host: wrong.example\r\nProxy-Connection: keep-alive\r\nConnection: X-Secret, keep-alive\r\n"
       b"X-Secret: drop me\r\nProxy-Authorization: Basic eDp5\r\nAccept: */*\r\n\r\n")


def test_absolute_uri_becomes_origin_form_without_hop_by_hop_headers():
    (head, end) = drain(RequestParser(), GET)
    assert end is END
    assert isinstance(head, ForwardHead)
    assert (head.method, head.host, head.port, head.target) == (b"GET", "example.com", 8080, b"/a/b?q=1")
    assert head.keep_alive
    rendered = head.render()
    assert rendered == (b"GET /a/b?q=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\n\r\n")


def test_default_port_and_empty_path():
    (head, _) = drain(RequestParser(), b"HEAD http://Example.COM HTTP/1.0\r\n\r\n")
    assert (head.host, head.port, head.target, head.keep_alive) == ("Example.COM", 80, b"/", False)
    assert b"Host: Example.COM\r\n" in head.render()


REQUESTS = [
    GET,
    b"POST http://h:1/x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    b"PUT http://[2001:db8::1]:81/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;ext=1\r\nhello\r\n0\r\nTrailer-A: b\r\n\r\n",
    b"CONNECT h:443 HTTP/1.1\r\n\r\n",
]


@pytest.mark.parametrize("raw", REQUESTS)
def test_every_split_point_gives_the_same_events(raw):
    whole = drain(RequestParser(), raw)
    for cut in range(1, len(raw)):
        assert drain(RequestParser(), raw, [cut]) == whole, cut
    # and one byte at a time
    assert drain(RequestParser(), raw, range(1, len(raw))) == whole


def test_chunked_body_passes_through_verbatim_and_ends():
    raw = REQUESTS[2]
    head, body, end = drain(RequestParser(), raw)
    assert head.host == "2001:db8::1" and head.port == 81
    assert body.data == raw[raw.index(b"\r\n\r\n") + 4:]
    assert end is END


def test_kept_alive_requests_are_parsed_one_by_one():
    raw = (b"POST http://a.example/ HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
           b"GET http://b.example:81/ HTTP/1.1\r\n\r\n")
    events = drain(RequestParser(), raw, eof=True)
    heads = [e for e in events if isinstance(e, ForwardHead)]
    assert [(h.host, h.port) for h in heads] == [("a.example", 80), ("b.example", 81)]
    assert events[1] == Body(b"abc") and events[2] is END and events[-1] is CLOSED


@pytest.mark.parametrize("raw,status", [
    (b"GET /local HTTP/1.1\r\n\r\n", 400),
    (b"GET https://x/ HTTP/1.1\r\n\r\n", 400),
    (b"GET http://user:pw@x/ HTTP/1.1\r\n\r\n", 400),
    (b"GET http://x/ HTTP/2.0\r\n\r\n", 505),
    (b"GET http://x/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"GET http://x/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
    (b"GET http://x/ HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    (b"GET http://x/ HTTP/1.1\r\nA : b\r\n\r\n", 400),
    (b"GET http://x/ HTTP/1.1\r\nA: b\r\n c\r\n\r\n", 400),
    (b"GET http://x/ HTTP/1.1\r\nA: b\rc\r\n\r\n", 400),
    (b"GET http://x/ HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 501),
    (b"CONNECT x HTTP/1.1\r\n\r\n", 400),
    (b"CONNECT x:99999 HTTP/1.1\r\n\r\n", 400),
    (b"CONNECT [::1:443 HTTP/1.1\r\n\r\n", 400),
    (b"GET  http://x/ HTTP/1.1\r\n\r\n", 400),
])
def test_malformed_requests_raise_protocol_error(raw, status):
    with pytest.raises(HttpProxyError) as info:
        drain(RequestParser(), raw, eof=True)
    assert info.value.status == status


def test_caps_on_request_line_and_headers():
    with pytest.raises(HttpProxyError) as info:
        drain(RequestParser(), b"GET http://x/" + b"a" * (9 * 1024))
    assert info.value.status == 414
    many = b"".join(b"H%d: v\r\n" % i for i in range(101))
    with pytest.raises(HttpProxyError) as info:
        drain(RequestParser(), b"GET http://x/ HTTP/1.1\r\n" + many + b"\r\n")
    assert info.value.status == 431
    with pytest.raises(HttpProxyError) as info:
        drain(RequestParser(), b"GET http://x/ HTTP/1.1\r\nBig: " + b"v" * (80 * 1024))
    assert info.value.status == 431


def test_stream_ending_inside_a_body_is_an_error():
    with pytest.raises(HttpProxyError):
        drain(RequestParser(), b"POST http://x/ HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc", eof=True)


def test_body_events_are_bounded():
    p = RequestParser()
    size = 3 * MAX_BODY_EVENT + 5
    p.feed(b"POST http://x/ HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % size + b"z" * size)
    assert isinstance(p.next_event(), ForwardHead)
    sizes = []
    while (ev := p.next_event()) is not END:
        sizes.append(len(ev.data))
    assert sum(sizes) == size and max(sizes) <= MAX_BODY_EVENT


# --- responses -------------------------------------------------------------

def responses(raw: bytes, method=b"GET", splits=(), eof=False):
    p = ResponseParser()
    p.expect(method)
    events = []
    cuts = [0, *sorted(splits), len(raw)]
    for a, b in zip(cuts, cuts[1:]):
        p.feed(raw[a:b])
        while (ev := p.next_event()) is not NEED_DATA:
            if isinstance(ev, Body) and events and isinstance(events[-1], Body):
                events[-1] = Body(events[-1].data + ev.data)
            else:
                events.append(ev)
            if ev is END:
                break
        if events and events[-1] is END:
            break
    if eof and not (events and events[-1] is END):
        p.feed_eof()
        while (ev := p.next_event()) is not NEED_DATA:
            events.append(ev)
            if ev is END:
                break
    return p, events


def test_response_with_length_then_keep_alive():
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5\r\n\r\nhi"
    for cut in range(1, len(raw)):
        p, (head, body, end) = responses(raw, splits=[cut])
        assert head.status == 200 and head.keep_alive and not head.close_delimited
        assert body == Body(b"hi") and end is END
        assert b"Keep-Alive" not in head.render(close=False)
        assert head.render(close=True).endswith(b"Connection: close\r\n\r\n")


def test_head_and_304_have_no_body_and_100_continue_is_passed_on():
    p, events = responses(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", method=b"HEAD")
    assert [type(e) for e in events] == [ResponseHead, type(END)]
    p, events = responses(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    assert [e.status for e in events if isinstance(e, ResponseHead)] == [100, 204]


def test_close_delimited_and_chunked_responses():
    p, events = responses(b"HTTP/1.0 200 OK\r\n\r\nuntil the end", eof=True)
    assert events[0].close_delimited and not events[0].keep_alive
    assert events[1] == Body(b"until the end") and events[2] is END
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    p, events = responses(raw)
    assert events[1].data == raw[raw.index(b"\r\n\r\n") + 4:] and events[2] is END


def test_origin_closing_early_is_an_error():
    with pytest.raises(HttpProxyError):
        responses(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", eof=True)
    with pytest.raises(HttpProxyError):
        responses(b"", eof=True)
    with pytest.raises(HttpProxyError):
        responses(b"SSH-2.0-OpenSSH\r\n\r\n")


def test_error_response_carries_the_deny_header():
    out = hp.error_response(403, "denied: x", deny_reason="no allow rule matches evil.example:443 … \r\nX: y")
    head = out.split(b"\r\n\r\n", 1)[0]
    assert b"\r\nX-Vpnw-Deny: no allow rule matches evil.example:443 ? " in head
    assert b"\r\nX: y" not in head


# --- fuzzing: only success or HttpProxyError ----------------------------------

_pieces = st.sampled_from([
    b"GET ", b"CONNECT ", b"POST ", b"http://", b"[::1]", b"h.example", b":80", b":0", b"/p", b"?q",
    b" HTTP/1.1", b" HTTP/1.0", b"\r\n", b"\n", b"\r", b"Content-Length: 3", b"Content-Length: x",
    b"Transfer-Encoding: chunked", b"Connection: close", b"3\r\nabc\r\n", b"0\r\n\r\n", b"ffffffffffffffffff\r\n",
    b": ", b" ", b"\x00", b"\xff", b"abc", b"@", b"[", b"]",
])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_pieces, st.binary(max_size=12)), max_size=30), st.data())
def test_fuzzed_requests_only_raise_protocol_error(parts, data):
    raw = b"".join(parts)
    splits = data.draw(st.lists(st.integers(0, len(raw)), max_size=4))
    p = RequestParser()
    try:
        drain(p, raw, splits, eof=True)
    except HttpProxyError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([
    b"HTTP/1.1 200 OK", b"HTTP/1.0 204 X", b"HTTP/1.1 100 Continue", b"HTTP/1.1 101 S", b"\r\n",
    b"Content-Length: 2", b"Transfer-Encoding: chunked", b"2\r\nab\r\n", b"0\r\n\r\n", b"hi"]),
    st.binary(max_size=8)), max_size=20), st.sampled_from([b"GET", b"HEAD"]))
def test_fuzzed_responses_only_raise_protocol_error(parts, method):
    try:
        responses(b"".join(parts), method=method, eof=True)
    except HttpProxyError:
        pass


# --- raw body runs: what the broker splices past the parser ------------------------------------

def drain_passing_raw(parser, data: bytes, splits, takes):
    """Like drain (no eof), but wherever the parser offers raw body bytes the
    shell takes up to the next of `takes` of them straight from the input, as
    the broker's splice does; those bytes are merged into the Body events."""
    events, pos = [], 0
    cuts = sorted({c for c in splits if 0 < c < len(data)} | {len(data)})
    takes = list(takes)

    def add(ev):
        if isinstance(ev, Body) and events and isinstance(events[-1], Body):
            events[-1] = Body(events[-1].data + ev.data)
        else:
            events.append(ev)

    while True:
        ev = parser.next_event()
        if ev is NEED_DATA:
            ahead = parser.raw_body_ahead()
            if ahead and pos < len(data):
                n = min(ahead, len(data) - pos, takes.pop() if takes else ahead)
                add(Body(data[pos:pos + n]))
                pos += n
                parser.raw_body_passed(n)
                continue
            if pos >= len(data):
                return events
            end = next(c for c in cuts if c > pos)
            parser.feed(data[pos:end])
            pos = end
        else:
            add(ev)


KEPT_ALIVE = (b"POST http://a.example/ HTTP/1.1\r\nContent-Length: 70000\r\n\r\n" + b"a" * 70000
              + b"PUT http://a.example/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"10000;x=y\r\n" + b"b" * 0x10000 + b"\r\n1\r\nc\r\n0\r\nT: 1\r\n\r\n"
              b"GET http://b.example/ HTTP/1.1\r\n\r\n")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, len(KEPT_ALIVE)), max_size=6),
       st.lists(st.integers(1, 1 << 17), max_size=6))
def test_raw_body_runs_give_the_same_messages_as_feeding(splits, takes):
    want = drain(RequestParser(), KEPT_ALIVE)
    assert drain_passing_raw(RequestParser(), KEPT_ALIVE, splits, takes) == want


def test_raw_body_ahead_only_inside_a_body_with_nothing_buffered():
    p = RequestParser()
    p.feed(b"POST http://a.example/ HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
    assert p.raw_body_ahead() == 0            # a head is due
    assert isinstance(p.next_event(), ForwardHead)
    assert p.raw_body_ahead() == 0            # three bytes buffered: they go first
    assert p.next_event() == Body(b"abc")
    assert p.next_event() is NEED_DATA and p.raw_body_ahead() == 7
    with pytest.raises(ValueError):
        p.raw_body_passed(8)                  # never past the body's end
    p.raw_body_passed(7)
    assert p.next_event() is END and p.raw_body_ahead() == 0
    r = ResponseParser()
    r.expect(b"GET")
    r.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n")
    assert isinstance(r.next_event(), ResponseHead)
    assert r.next_event() == Body(b"5\r\n") and r.raw_body_ahead() == 5   # this chunk's data
    r.raw_body_passed(5)
    assert r.raw_body_ahead() == 0            # the chunk's line end is parsed
    r.feed(b"\r\n0\r\n\r\n")
    assert r.next_event() == Body(b"\r\n0\r\n\r\n") and r.next_event() is END

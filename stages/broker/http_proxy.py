"""HTTP proxy door: a sans-I/O parser (bytes in, events out).

Three parsers share one framing core (http_framing.py) and one reading of
heads and headers (http_heads.py); what the door answers itself is
http_answers.py's:

* `RequestParser` reads what a client sends to the HTTP proxy door: a CONNECT
  head (after which the stream is a tunnel and the parser hands back what it
  already buffered), or an absolute-URI request of any method, re-written to
  origin-form, followed by its body, byte for byte (Content-Length or chunked).
  After a request's body ends the next request head is parsed on its own, so
  each request on a kept-alive client connection is decided on its own.
* `ResponseParser` reads the origin's answers to plain-HTTP requests, so that
  the broker knows where each response ends (Content-Length, chunked, no body,
  or close-delimited) and can keep the client connection alive between them.
* `SecretRequestParser` reads what the program sends to a secret door
  (docs/secrets.md): origin-form requests, their credentials dropped.

Events: a head (`ConnectHead`, `ForwardHead`, `ResponseHead`), `Body(data)`
(raw bytes to pass on, chunk framing included), `END` (message complete),
`CLOSED` (the client closed cleanly between requests) and `NEED_DATA`. Malformed input raises `HttpProxyError`, and nothing else.

The heads never go to the record: the record keeps host and port only.
"""
from __future__ import annotations

from stages.broker.http_answers import CONNECT_OK, denied_response, error_response  # noqa: F401  (the doors' answers, found here as the doors import them)
from stages.broker.http_framing import (
    CHUNK_SIZE, CLOSED, DONE, END, HEAD, IDLE, STREAM_CLOSED, TUNNEL, BODY_START, Framer,
)
from stages.broker.http_heads import (  # noqa: F401  (Body and the heads: this parser's events)
    HOST_HEADER, MAX_REQUEST_LINE, MAX_RESPONSE_HEADERS, MAX_HEADERS, METHOD, VERSION, BAD_VALUE,
    STATUS_LINE, Body, ConnectHead, ForwardHead, HttpProxyError, ResponseHead, SecretHead,
    body_framing, connection_tokens, keeps_alive, parse_absolute_uri, parse_headers, split_authority,
    split_lines, split_request_line, strip_hop_by_hop,
)
from stages.broker.sans_io import NEED_DATA  # noqa: F401 - NEED_DATA is one of this parser's events


class RequestParser(Framer):
    """Client -> HTTP proxy door."""
    _AFTER_MESSAGE = HEAD     # the next request head may follow at once

    def __init__(self):
        super().__init__()
        self._method = b""

    def next_event(self):
        if self._mode is TUNNEL:
            raise HttpProxyError("the stream is a tunnel now")
        if self._mode is STREAM_CLOSED:
            return CLOSED
        if self._mode is DONE:
            self._mode = self._AFTER_MESSAGE
            return END
        if self._mode is not HEAD:
            event = self._body_event()
            if event is END:
                self._mode = self._AFTER_MESSAGE
            return event
        # Empty lines between requests are tolerated (RFC 9112 2.2).
        while self._buf[:2] == b"\r\n" or self._buf[:1] == b"\n":
            del self._buf[:2 if self._buf[:1] == b"\r" else 1]
        if not self._buf and self._eof:
            self._mode = STREAM_CLOSED
            return CLOSED
        head = self._take_head(MAX_REQUEST_LINE)
        if head is None:
            return NEED_DATA
        return self._parse_request_head(head)

    def body_follows(self) -> bool:
        """After a ForwardHead: whether a body comes (False: next_event()
        gives END at once)."""
        return self._mode is not DONE

    def tunnel_data(self) -> bytes:
        """After a ConnectHead: bytes the client sent ahead of the tunnel."""
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def _parse_request_head(self, head: bytes):
        lines = split_lines(head)
        request_line, header_lines = lines[0], lines[1:]
        if len(request_line) > MAX_REQUEST_LINE:
            raise HttpProxyError("request line too long", 414)
        method, target, version = split_request_line(request_line)
        headers = parse_headers(header_lines, MAX_HEADERS)
        names = [name.lower() for name, _ in headers]
        if method == b"CONNECT":
            host, port = split_authority(target)
            self._mode = TUNNEL
            return ConnectHead(host, port, version)
        host, port, authority, origin_form = parse_absolute_uri(target)
        tokens = connection_tokens(headers, names)
        framing, length = body_framing(headers, names, is_request=True)
        keep_alive = keeps_alive(version, tokens)
        kept = strip_hop_by_hop(headers, names, tokens, also=HOST_HEADER)
        if b"upgrade" in tokens:
            # An upgraded stream would no longer be HTTP we can frame.
            raise HttpProxyError("protocol upgrades are not forwarded (use CONNECT)", 501)
        kept.insert(0, (b"Host", authority))
        self._mode = BODY_START[framing]
        self._left = length
        self._chunk_state = CHUNK_SIZE
        self._method = method
        return ForwardHead(method, host, port, origin_form, version, tuple(kept), keep_alive)



_LOOPBACK_NAMES = (b"127.0.0.1", b"localhost", b"[::1]")


class SecretRequestParser(RequestParser):
    """The program -> a secret door: requests as to an origin server
    (origin-form, or absolute-form naming the door or the secret's host,
    nothing else), each parsed on its own on a kept-alive connection. What
    could carry a request or a credential elsewhere is refused here:
    CONNECT, a second Host, a Host or absolute URI naming another host;
    smuggling (both framings, bare CR, control characters, oversized heads)
    is refused by the framing shared with the HTTP door."""

    def __init__(self, host: str, port: int, door_port: int, credential_names: frozenset):
        super().__init__()
        self.host = host
        self.authority = (host if port == 443 else f"{host}:{port}").encode("ascii")
        if ":" in host:
            self.authority = b"[" + host.encode("ascii") + b"]" + (b"" if port == 443 else b":%d" % port)
        port_text = str(door_port).encode()
        self._own = {n + b":" + port_text for n in _LOOPBACK_NAMES} | {self.authority,
                                                                       self.authority + b":%d" % port}
        self._drop = frozenset(credential_names) | HOST_HEADER | {b"upgrade"}

    def _parse_request_head(self, head: bytes):
        lines = split_lines(head)
        request_line, header_lines = lines[0], lines[1:]
        method, target, version = split_request_line(request_line)
        if method == b"CONNECT":
            raise HttpProxyError("a secret door forwards requests to its host; it opens no tunnels", 405)
        headers = parse_headers(header_lines, MAX_HEADERS)
        names = [name.lower() for name, _ in headers]
        hosts = [v for n, (_, v) in zip(names, headers) if n == b"host"]
        if len(hosts) > 1:
            raise HttpProxyError("more than one Host header")
        if hosts and hosts[0].lower() not in self._own:
            raise HttpProxyError(f"Host {hosts[0].decode('ascii', 'replace')[:100]} is not this door's; "
                                 f"it forwards only to {self.host}")
        if not target.startswith(b"/"):
            if target[:7].lower() != b"http://" and target[:8].lower() != b"https://":
                raise HttpProxyError("the request target is not a path")
            rest = target.split(b"://", 1)[1]
            cut = min([i for i in (rest.find(b"/"), rest.find(b"?"), rest.find(b"#")) if i >= 0]
                      or [len(rest)])
            authority, tail = rest[:cut].lower(), rest[cut:].split(b"#", 1)[0]
            if authority not in self._own:
                raise HttpProxyError(f"the URI names {authority.decode('ascii', 'replace')[:100]}; "
                                     f"this door forwards only to {self.host}")
            target = tail if tail.startswith(b"/") else b"/" + tail
        tokens = connection_tokens(headers, names)
        framing, length = body_framing(headers, names, is_request=True)
        upgrade = b"upgrade" in tokens
        if upgrade:
            wanted = [v.strip().lower() for n, (_, v) in zip(names, headers) if n == b"upgrade"]
            if wanted != [b"websocket"] or framing != "none":
                raise HttpProxyError("only a WebSocket upgrade without a body is forwarded", 501)
        kept = strip_hop_by_hop(headers, names, tokens, also=self._drop)
        kept.insert(0, (b"Host", self.authority))
        self._mode = BODY_START[framing]
        self._left = length
        self._chunk_state = CHUNK_SIZE
        self._method = method
        return SecretHead(method, target, version, tuple(kept), keeps_alive(version, tokens), upgrade)



class ResponseParser(Framer):
    """Origin -> broker, for plain-HTTP forwarding. Call `expect(method)`
    before each response so HEAD answers are framed right."""
    _AFTER_MESSAGE = IDLE     # nothing until the next request is sent

    def __init__(self):
        super().__init__()
        self._method = b"GET"
        self._mode = IDLE
        self._upgrade = False

    def expect(self, method: bytes, upgrade: bool = False) -> None:
        """`upgrade`: the request asked for a protocol upgrade (a secret
        door's WebSocket), so a 101 ends HTTP on this stream."""
        if self._mode is not IDLE:
            raise HttpProxyError("previous response not finished")
        self._method = method
        self._mode = HEAD
        self._upgrade = upgrade

    def tunnel_data(self) -> bytes:
        """After a 101: bytes the origin sent after its head."""
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def next_event(self):
        if self._mode is TUNNEL:
            raise HttpProxyError("the stream is a tunnel now")
        if self._mode is IDLE:
            if self._buf:
                raise HttpProxyError("origin sent data nobody asked for")
            return NEED_DATA if not self._eof else END
        if self._mode is STREAM_CLOSED:
            return END
        if self._mode is DONE:
            self._mode = self._AFTER_MESSAGE
            return END
        if self._mode is not HEAD:
            event = self._body_event()
            if event is END and self._mode is not STREAM_CLOSED:
                self._mode = self._AFTER_MESSAGE
            return event
        head = self._take_head(MAX_REQUEST_LINE)
        if head is None:
            if self._eof:
                raise HttpProxyError("origin closed before answering")
            return NEED_DATA
        return self._parse_response_head(head)

    def _parse_response_head(self, head: bytes):
        lines = split_lines(head)
        match = STATUS_LINE.match(lines[0])
        if not match:
            raise HttpProxyError("malformed status line", 502)
        version, status, reason = match.group(1), int(match.group(2)), match.group(3) or b""
        headers = parse_headers(lines[1:], MAX_RESPONSE_HEADERS)
        names = [name.lower() for name, _ in headers]
        tokens = connection_tokens(headers, names)
        keep_alive = keeps_alive(version, tokens)
        kept = tuple(strip_hop_by_hop(headers, names, tokens))
        if status < 200:
            if status == 101:
                if not self._upgrade or b"upgrade" not in tokens:
                    raise HttpProxyError("origin switched protocols", 502)
                # The upgrade the client asked for: its Connection and Upgrade
                # headers go back with the head; the stream is not HTTP now.
                self._mode = TUNNEL
                return ResponseHead(status, version, reason, tuple(headers), False, False)
            self._mode = HEAD  # the real answer follows
            return ResponseHead(status, version, reason, kept, True, False)
        if self._method == b"HEAD" or status in (204, 304):
            framing, length = "none", 0
        else:
            framing, length = body_framing(headers, names, is_request=False)
        if framing == "close":
            keep_alive = False
        self._mode = BODY_START[framing]
        self._left = length
        self._chunk_state = CHUNK_SIZE
        return ResponseHead(status, version, reason, kept, keep_alive, framing == "close")


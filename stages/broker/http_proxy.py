"""HTTP proxy door: a sans-I/O parser (bytes in, events out).

Two parsers share one framing core:

* `RequestParser` reads what a client sends to the HTTP proxy door: a CONNECT
  head (after which the stream is a tunnel and the parser hands back what it
  already buffered), or an absolute-URI request of any method, re-written to
  origin-form, followed by its body, byte for byte (Content-Length or chunked).
  After a request's body ends the next request head is parsed on its own, so
  each request on a kept-alive client connection is decided on its own.
* `ResponseParser` reads the origin's answers to plain-HTTP requests, so that
  the broker knows where each response ends (Content-Length, chunked, no body,
  or close-delimited) and can keep the client connection alive between them.

Events: a head (`ConnectHead`, `ForwardHead`, `ResponseHead`), `Body(data)`
(raw bytes to pass on, chunk framing included), `END` (message complete),
`CLOSED` (the client closed cleanly between requests) and `NEED_DATA`. Malformed input raises `HttpProxyError`, and nothing else.

The heads never go to the record: the record keeps host and port only.
"""
from __future__ import annotations

import re

from stages.startup.records import NamedTuple   # not dataclasses: the loop's import (records.py)
from stages.broker.sans_io import NEED_DATA, Sentinel  # noqa: F401 - NEED_DATA is one of this parser's events

MAX_REQUEST_LINE = 8 * 1024
MAX_HEADERS_BYTES = 64 * 1024
MAX_HEADERS = 100
MAX_RESPONSE_HEADERS = 256       # origins are less tidy than clients
MAX_CHUNK_LINE = 4 * 1024
MAX_BODY_EVENT = 256 * 1024      # a Body event never holds more than this

_HOST = frozenset({b"host"})      # the forwarder writes Host itself, from the URI

# Hop-by-hop: meaningful for one connection only, never passed on.
HOP_BY_HOP = frozenset({
    b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization",
    b"proxy-authenticate", b"te", b"upgrade",
})

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_METHOD = _TOKEN
_VERSION = re.compile(rb"HTTP/1\.[01]\Z")
_STATUS_LINE = re.compile(rb"(HTTP/1\.[01]) ([0-9]{3})(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?\Z")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_PORT = re.compile(rb"[0-9]{1,5}\Z")
# Bytes >= 0x80 pass (as UTF-8) so that decide.parse_target refuses a
# non-ASCII name as a denial, the same as the SOCKS door does.
_HOST_CHARS = re.compile(rb"[A-Za-z0-9._~!$&'()*+,;=%\x80-\xff-]*\Z")
_IPV6_CHARS = re.compile(rb"[0-9A-Fa-f:.%A-Za-z_-]+\Z")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}\Z")


class HttpProxyError(Exception):
    """Malformed or unsupported HTTP; `status` is the answer to give."""

    def __init__(self, reason: str, status: int = 400):
        super().__init__(reason)
        self.reason = reason
        self.status = status


END = Sentinel("END")          # the message (its head and body) is complete
CLOSED = Sentinel("CLOSED")    # the client closed cleanly between requests


# Where a parser is in its stream. The transitions:
#   IDLE  -expect()->  HEAD                      (responses only: one per request)
#   HEAD  -a head->    _BODY_START[framing]      (CONNECT: TUNNEL; a 1xx: HEAD again)
#   LENGTH / CHUNKED  -the last byte->  DONE     UNTIL_CLOSE  -end of stream->  STREAM_CLOSED
#   DONE  -END->       _AFTER_MESSAGE            (a request: HEAD; a response: IDLE)
#   HEAD  -end of stream between messages->  STREAM_CLOSED
IDLE = Sentinel("IDLE")                    # no response is due
HEAD = Sentinel("HEAD")                    # reading a message head
LENGTH = Sentinel("LENGTH")                # a body of Content-Length bytes
CHUNKED = Sentinel("CHUNKED")              # a chunked body
UNTIL_CLOSE = Sentinel("UNTIL_CLOSE")      # a response body that ends when the origin closes
DONE = Sentinel("DONE")                    # the message ended; END is due
TUNNEL = Sentinel("TUNNEL")                # after CONNECT: no HTTP any more
STREAM_CLOSED = Sentinel("STREAM_CLOSED")  # the stream ended where a message may end

# Framing (from _body_framing) -> the state that reads that body.
_BODY_START = {"none": DONE, "length": LENGTH, "chunked": CHUNKED, "close": UNTIL_CLOSE}

# Inside a chunked body.
CHUNK_SIZE = Sentinel("CHUNK_SIZE")
CHUNK_DATA = Sentinel("CHUNK_DATA")
CHUNK_DATA_END = Sentinel("CHUNK_DATA_END")   # the line end after a chunk's data
TRAILER = Sentinel("TRAILER")


class Body(NamedTuple):
    data: bytes


class ConnectHead(NamedTuple):
    host: str
    port: int
    version: bytes


class ForwardHead(NamedTuple):
    method: bytes
    host: str               # as written in the URI (IPv6 without brackets)
    port: int
    target: bytes           # origin-form: path and query
    version: bytes
    headers: tuple           # ((name, value), ...) hop-by-hop removed, Host set
    keep_alive: bool         # the client wants the connection kept

    def render(self) -> bytes:
        """The head to send to the origin."""
        lines = [self.method + b" " + self.target + b" " + self.version]
        lines += [n + b": " + v for n, v in self.headers]
        return b"\r\n".join(lines) + b"\r\n\r\n"


class ResponseHead(NamedTuple):
    status: int
    version: bytes
    reason: bytes
    headers: tuple           # hop-by-hop removed
    keep_alive: bool         # the origin allows another request on this connection
    close_delimited: bool    # the body ends when the origin closes

    def render(self, *, close: bool) -> bytes:
        """The head to send to the client; `close` tells it we will close."""
        lines = [self.version + b" " + str(self.status).encode() + b" " + self.reason]
        lines += [n + b": " + v for n, v in self.headers]
        if close and self.status >= 200:
            lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"


def _split_lines(head: bytes) -> list[bytes]:
    # Accept CRLF and bare LF line ends (as h11 does); a bare CR is an error,
    # since a parser that disagrees with the origin about line ends can be
    # made to smuggle a request. (A CR that ends the head's last line ends it.)
    text = head.replace(b"\r\n", b"\n")
    if text.endswith(b"\r"):
        text = text[:-1]
    if b"\r" in text:
        raise HttpProxyError("bare CR in the head")
    return text.split(b"\n")


# Every line of a header block well formed (a token, a colon, a value with no
# control character but tab): the common case, checked in one match; the
# line-by-line loop below then only runs to say what is wrong.
_WELL_FORMED_HEADERS = re.compile(
    rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*(?:\n|\Z))*\Z")


def _parse_headers(lines: list[bytes], max_headers: int) -> list[tuple[bytes, bytes]]:
    if len(lines) > max_headers:
        raise HttpProxyError("too many headers", 431)
    if b"" not in lines and _WELL_FORMED_HEADERS.match(b"\n".join(lines)):
        return [(name, value.strip(b" \t"))
                for name, _, value in (line.partition(b":") for line in lines)]
    headers = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise HttpProxyError("folded header lines are not accepted")
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise HttpProxyError("malformed header line")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise HttpProxyError("control character in a header value")
        headers.append((name, value))
    return headers


# The functions below take the header names lower-cased once, beside the
# headers themselves (`names[i]` is `headers[i]`'s name, lower case).

def _connection_tokens(headers, names: list[bytes]) -> set[bytes]:
    tokens = set()
    for name, (_, value) in zip(names, headers):
        if name == b"connection" or name == b"proxy-connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def _strip_hop_by_hop(headers, names: list[bytes], tokens: set[bytes], also: frozenset = frozenset()):
    drop = HOP_BY_HOP | tokens | also
    return [header for name, header in zip(names, headers) if name not in drop]


def _keeps_alive(version: bytes, tokens: set[bytes]) -> bool:
    """RFC 9112 9.3: HTTP/1.1 persists unless "close"; HTTP/1.0 only with "keep-alive"."""
    if version == b"HTTP/1.0":
        return b"keep-alive" in tokens
    return b"close" not in tokens


def _body_framing(headers, names: list[bytes], *, is_request: bool) -> tuple[str, int]:
    """('none'|'length'|'chunked'|'close', length)."""
    te = [v for n, (_, v) in zip(names, headers) if n == b"transfer-encoding"]
    cl = [v for n, (_, v) in zip(names, headers) if n == b"content-length"]
    if te:
        if cl:
            # Both at once is how requests are smuggled past a proxy.
            raise HttpProxyError("both Transfer-Encoding and Content-Length")
        codings = [c.strip().lower() for v in te for c in v.split(b",")]
        if codings[-1:] != [b"chunked"] or codings.count(b"chunked") != 1:
            if is_request:
                raise HttpProxyError("unsupported Transfer-Encoding", 501)
            return "close", 0
        return "chunked", 0
    if cl:
        values = {c.strip() for v in cl for c in v.split(b",")}
        if len(values) != 1:
            raise HttpProxyError("conflicting Content-Length values")
        value = values.pop()
        if not value.isdigit() or len(value) > 18:
            raise HttpProxyError("malformed Content-Length")
        length = int(value)
        return ("length", length) if length else ("none", 0)
    return ("none", 0) if is_request else ("close", 0)


def split_authority(authority: bytes) -> tuple[str, int]:
    """b"host:port" / b"[v6]:port" -> (host, port). Only splits and checks the
    characters; what a host may be is for decide.parse_target."""
    if authority.startswith(b"["):
        end = authority.find(b"]")
        if end < 0:
            raise HttpProxyError("unclosed [ in the authority")
        host, rest = authority[1:end], authority[end + 1:]
        if not host or not _IPV6_CHARS.match(host):
            raise HttpProxyError("malformed IPv6 literal")
        if not rest.startswith(b":"):
            raise HttpProxyError("missing port")
        port = rest[1:]
    else:
        host, sep, port = authority.rpartition(b":")
        if not sep:
            raise HttpProxyError("missing port")
        if not host or not _HOST_CHARS.match(host):
            raise HttpProxyError("malformed host")
    if not _PORT.match(port) or int(port) > 65535:
        raise HttpProxyError("malformed port")
    try:
        return host.decode("utf-8"), int(port)
    except UnicodeDecodeError:
        raise HttpProxyError("the host is not UTF-8") from None


def _parse_absolute_uri(target: bytes) -> tuple[str, int, bytes, bytes]:
    """b"http://host[:port]/path?q" -> (host, port, authority, origin-form)."""
    if target[:7].lower() != b"http://":
        if target.startswith(b"/"):
            raise HttpProxyError("this is a proxy: the request needs an absolute http:// URI")
        raise HttpProxyError("only http:// URIs are forwarded (use CONNECT for https)")
    rest = target[7:]
    cut = len(rest)
    for sep in (b"/", b"?", b"#"):
        i = rest.find(sep)
        if 0 <= i < cut:
            cut = i
    authority, tail = rest[:cut], rest[cut:]
    if b"@" in authority:
        raise HttpProxyError("credentials in the URI are not forwarded")
    if not authority:
        raise HttpProxyError("empty host in the URI")
    tail = tail.split(b"#", 1)[0]
    if not tail.startswith(b"/"):
        tail = b"/" + tail
    has_port = (authority.rfind(b":") > authority.rfind(b"]"))
    host, port = split_authority(authority if has_port else authority + b":80")
    return host, port, authority, tail


class _Framer:
    """The body-reading half shared by requests and responses."""
    _AFTER_MESSAGE: Sentinel    # where a subclass goes after a message's END

    def __init__(self):
        self._buf = bytearray()
        self._mode = HEAD          # one of the states above
        self._left = 0             # bytes left of the body or current chunk
        self._chunk_state = CHUNK_SIZE
        self._eof = False

    def feed(self, data: bytes) -> None:
        if self._eof:
            raise HttpProxyError("data after end of stream")
        self._buf += data

    def feed_eof(self) -> None:
        self._eof = True

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def raw_body_ahead(self) -> int:
        """How many of the bytes that come next in the stream are body data
        the parser need not see: the rest of a Content-Length body or of the
        current chunk's data, when nothing is buffered. The I/O shell may
        move them itself (os.splice) and then call `raw_body_passed`; 0 when
        the next bytes must be fed (a head, a chunk-size line, a trailer)."""
        if self._buf or self._eof:
            return 0
        if self._mode is LENGTH or (self._mode is CHUNKED and self._chunk_state is CHUNK_DATA):
            return self._left
        return 0

    def raw_body_passed(self, n: int) -> None:
        """n of the bytes `raw_body_ahead` offered went on without the parser."""
        if not 0 < n <= self.raw_body_ahead():
            raise ValueError("more body passed than was ahead")
        self._left -= n
        if self._left == 0:
            if self._mode is LENGTH:
                self._mode = DONE
            else:
                self._chunk_state = CHUNK_DATA_END

    def _take_head(self, first_line_cap: int) -> bytes | None:
        buf = self._buf
        if not buf:
            return None
        # The head ends at the first blank line: "\r\n\r\n", or with bare LF
        # line ends "\n\n" or "\n\r\n". The usual CRLF end is found first;
        # the others only matter where they start before it.
        crlf = buf.find(b"\r\n\r\n")
        limit = len(buf) if crlf < 0 else crlf + 2
        ends = [(crlf, 4)] if crlf >= 0 else []
        end = buf.find(b"\n\n", 0, limit + 1)
        if end >= 0:
            ends.append((end, 2))
        mixed = buf.find(b"\n\r\n", 0, limit + 2)
        if mixed >= 0:
            ends.append((mixed, 3))
        if not ends:
            first_nl = self._buf.find(b"\n")
            if first_nl < 0 and len(self._buf) > first_line_cap:
                raise HttpProxyError("first line too long", 414)
            if first_nl > first_line_cap:
                raise HttpProxyError("first line too long", 414)
            if len(self._buf) > first_line_cap + MAX_HEADERS_BYTES:
                raise HttpProxyError("headers too large", 431)
            if self._eof and self._buf:
                raise HttpProxyError("stream ended inside a head")
            return None
        pos, width = min(ends)
        head = bytes(self._buf[:pos])
        if len(head) > first_line_cap + MAX_HEADERS_BYTES:
            raise HttpProxyError("headers too large", 431)
        del self._buf[:pos + width]
        return head

    def _body_event(self):
        if self._mode is LENGTH:
            if not self._buf:
                if self._eof:
                    raise HttpProxyError("stream ended inside a body")
                return NEED_DATA
            n = min(self._left, len(self._buf), MAX_BODY_EVENT)
            data = bytes(self._buf[:n])
            del self._buf[:n]
            self._left -= n
            if self._left == 0:
                self._mode = DONE
            return Body(data)
        if self._mode is UNTIL_CLOSE:
            if self._buf:
                n = min(len(self._buf), MAX_BODY_EVENT)
                data = bytes(self._buf[:n])
                del self._buf[:n]
                return Body(data)
            if self._eof:
                self._mode = STREAM_CLOSED
                return END
            return NEED_DATA
        return self._chunked_event()

    def _chunked_event(self):
        # Chunks pass through verbatim; parsing only finds where the body ends.
        out = bytearray()
        while len(out) < MAX_BODY_EVENT:
            if self._chunk_state is CHUNK_SIZE:
                nl = self._buf.find(b"\n")
                if nl < 0:
                    if len(self._buf) > MAX_CHUNK_LINE:
                        raise HttpProxyError("chunk size line too long")
                    break
                if nl > MAX_CHUNK_LINE:
                    raise HttpProxyError("chunk size line too long")
                line = bytes(self._buf[:nl])
                stripped = line[:-1] if line.endswith(b"\r") else line
                size = stripped.split(b";", 1)[0].strip(b" \t")
                if not _HEX.match(size) or _BAD_VALUE.search(stripped):
                    raise HttpProxyError("malformed chunk size")
                out += self._buf[:nl + 1]
                del self._buf[:nl + 1]
                self._left = int(size, 16)
                self._chunk_state = CHUNK_DATA if self._left else TRAILER
                self._trailer_bytes = 0
            elif self._chunk_state is CHUNK_DATA:
                if not self._buf:
                    break
                n = min(self._left, len(self._buf), MAX_BODY_EVENT - len(out))
                out += self._buf[:n]
                del self._buf[:n]
                self._left -= n
                if self._left == 0:
                    self._chunk_state = CHUNK_DATA_END
                if not n:
                    break
            elif self._chunk_state is CHUNK_DATA_END:
                if self._buf[:2] == b"\r\n":
                    out += b"\r\n"
                    del self._buf[:2]
                elif self._buf[:1] == b"\n":
                    out += b"\n"
                    del self._buf[:1]
                elif len(self._buf) >= 2 or (self._buf and self._buf[:1] != b"\r"):
                    raise HttpProxyError("chunk not followed by a line end")
                else:
                    break
                self._chunk_state = CHUNK_SIZE
            else:  # trailer lines until an empty one
                nl = self._buf.find(b"\n")
                if nl < 0:
                    if self._trailer_bytes + len(self._buf) > MAX_HEADERS_BYTES:
                        raise HttpProxyError("trailers too large", 431)
                    break
                line = bytes(self._buf[:nl + 1])
                del self._buf[:nl + 1]
                out += line
                self._trailer_bytes += len(line)
                if self._trailer_bytes > MAX_HEADERS_BYTES:
                    raise HttpProxyError("trailers too large", 431)
                body = line.rstrip(b"\n")
                body = body[:-1] if body.endswith(b"\r") else body
                if b"\r" in body:
                    raise HttpProxyError("bare CR in a trailer")
                if not body:
                    self._mode = DONE
                    break
                _parse_headers([body], MAX_HEADERS)
        if out:
            return Body(bytes(out))
        if self._mode is DONE:
            return END
        if self._eof:
            raise HttpProxyError("stream ended inside a chunked body")
        return NEED_DATA


class RequestParser(_Framer):
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
        lines = _split_lines(head)
        request_line, header_lines = lines[0], lines[1:]
        if len(request_line) > MAX_REQUEST_LINE:
            raise HttpProxyError("request line too long", 414)
        parts = request_line.split(b" ")
        if len(parts) != 3:
            raise HttpProxyError("malformed request line")
        method, target, version = parts
        if not _METHOD.match(method):
            raise HttpProxyError("malformed method")
        if not _VERSION.match(version):
            raise HttpProxyError("unsupported HTTP version", 505)
        if not target or _BAD_VALUE.search(target) or b"\t" in target:
            raise HttpProxyError("malformed request target")
        headers = _parse_headers(header_lines, MAX_HEADERS)
        names = [name.lower() for name, _ in headers]
        if method == b"CONNECT":
            host, port = split_authority(target)
            self._mode = TUNNEL
            return ConnectHead(host, port, version)
        host, port, authority, origin_form = _parse_absolute_uri(target)
        tokens = _connection_tokens(headers, names)
        framing, length = _body_framing(headers, names, is_request=True)
        keep_alive = _keeps_alive(version, tokens)
        kept = _strip_hop_by_hop(headers, names, tokens, also=_HOST)
        if b"upgrade" in tokens:
            # An upgraded stream would no longer be HTTP we can frame.
            raise HttpProxyError("protocol upgrades are not forwarded (use CONNECT)", 501)
        kept.insert(0, (b"Host", authority))
        self._mode = _BODY_START[framing]
        self._left = length
        self._chunk_state = CHUNK_SIZE
        self._method = method
        return ForwardHead(method, host, port, origin_form, version, tuple(kept), keep_alive)


class SecretHead(NamedTuple):
    """A request at a secret door (docs/secrets.md), ready for the secret's
    host: origin-form, the program's credential headers gone, Host the
    secret's own; the door adds the real credential in `render`."""
    method: bytes
    target: bytes            # origin-form: path and query
    version: bytes
    headers: tuple           # ((name, value), ...): hop-by-hop and credentials removed, Host set
    keep_alive: bool
    upgrade: bool            # a WebSocket upgrade: its Connection and Upgrade headers kept

    def render(self, credential: tuple[bytes, bytes]) -> bytes:
        lines = [self.method + b" " + self.target + b" " + self.version]
        lines += [n + b": " + v for n, v in self.headers]
        lines.append(credential[0] + b": " + credential[1])
        if self.upgrade:
            lines += [b"Connection: Upgrade", b"Upgrade: websocket"]
        return b"\r\n".join(lines) + b"\r\n\r\n"


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
        self._drop = frozenset(credential_names) | _HOST | {b"upgrade"}

    def _parse_request_head(self, head: bytes):
        lines = _split_lines(head)
        request_line, header_lines = lines[0], lines[1:]
        parts = request_line.split(b" ")
        if len(parts) != 3:
            raise HttpProxyError("malformed request line")
        method, target, version = parts
        if not _METHOD.match(method):
            raise HttpProxyError("malformed method")
        if not _VERSION.match(version):
            raise HttpProxyError("unsupported HTTP version", 505)
        if not target or _BAD_VALUE.search(target) or b"\t" in target or b" " in target:
            raise HttpProxyError("malformed request target")
        if method == b"CONNECT":
            raise HttpProxyError("a secret door forwards requests to its host; it opens no tunnels", 405)
        headers = _parse_headers(header_lines, MAX_HEADERS)
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
        tokens = _connection_tokens(headers, names)
        framing, length = _body_framing(headers, names, is_request=True)
        upgrade = b"upgrade" in tokens
        if upgrade:
            wanted = [v.strip().lower() for n, (_, v) in zip(names, headers) if n == b"upgrade"]
            if wanted != [b"websocket"] or framing != "none":
                raise HttpProxyError("only a WebSocket upgrade without a body is forwarded", 501)
        kept = _strip_hop_by_hop(headers, names, tokens, also=self._drop)
        kept.insert(0, (b"Host", self.authority))
        self._mode = _BODY_START[framing]
        self._left = length
        self._chunk_state = CHUNK_SIZE
        self._method = method
        return SecretHead(method, target, version, tuple(kept), _keeps_alive(version, tokens), upgrade)


class ResponseParser(_Framer):
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
        lines = _split_lines(head)
        match = _STATUS_LINE.match(lines[0])
        if not match:
            raise HttpProxyError("malformed status line", 502)
        version, status, reason = match.group(1), int(match.group(2)), match.group(3) or b""
        headers = _parse_headers(lines[1:], MAX_RESPONSE_HEADERS)
        names = [name.lower() for name, _ in headers]
        tokens = _connection_tokens(headers, names)
        keep_alive = _keeps_alive(version, tokens)
        kept = tuple(_strip_hop_by_hop(headers, names, tokens))
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
            framing, length = _body_framing(headers, names, is_request=False)
        if framing == "close":
            keep_alive = False
        self._mode = _BODY_START[framing]
        self._left = length
        self._chunk_state = CHUNK_SIZE
        return ResponseHead(status, version, reason, kept, keep_alive, framing == "close")


def error_response(status: int, reason: str, *, deny_reason: str | None = None) -> bytes:
    """A short answer from the proxy itself; the connection closes after it."""
    titles = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout",
              414: "URI Too Long", 431: "Request Header Fields Too Large",
              501: "Not Implemented", 502: "Bad Gateway", 504: "Gateway Timeout",
              505: "HTTP Version Not Supported"}
    body = f"vpnw: {reason}\n".encode("utf-8", "replace")
    lines = [f"HTTP/1.1 {status} {titles.get(status, 'Error')}".encode(),
             b"Content-Type: text/plain; charset=utf-8",
             b"Content-Length: " + str(len(body)).encode(),
             b"Connection: close"]
    if deny_reason is not None:
        lines.append(b"X-Vpnw-Deny: " + header_safe(deny_reason))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def denied_response(denied) -> bytes:
    """The 403 of a refusal (connector.Denied), at the HTTP door and to a
    captured plain-HTTP request alike: the body is the DENY line's words
    (`vpnw: evil.example:443 denied: REASON`), the reason again in
    X-Vpnw-Deny, and Proxy-Status (RFC 9209) names vpnw."""
    body = (denied.text() + "\n").encode("utf-8", "replace")
    # The reason phrase carries the words too: clients that show no body of
    # a refused CONNECT print it (Python's http.client, so requests and pip:
    # "Tunnel connection failed: 403 vpnw: evil.example:443 denied: ...").
    lines = [b"HTTP/1.1 403 " + header_safe(denied.text()),
             b"Content-Type: text/plain; charset=utf-8",
             b"Content-Length: " + str(len(body)).encode(),
             b"Connection: close",
             b"Proxy-Status: vpnw; error=destination_ip_prohibited" if denied.rule == "machine" else
             b"Proxy-Status: vpnw; error=http_request_denied",
             b"X-Vpnw-Deny: " + header_safe(denied.reason)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def header_safe(text: str) -> bytes:
    """A reason sentence as a header value: ASCII, no control characters."""
    raw = text.encode("ascii", "replace")
    return _BAD_VALUE.sub(b" ", raw)[:400]


CONNECT_OK = b"HTTP/1.1 200 Connection established\r\n\r\n"

"""The HTTP messages the proxy door and the secret doors read and write,
without I/O: the heads as types (`ConnectHead`, `ForwardHead`,
`ResponseHead`, `SecretHead`, and `Body`, a piece of a message's body),
the limits, and the pure readers of a head's lines and headers (CRLF or
bare LF, the well-formed headers, Connection tokens, hop-by-hop headers,
keep-alive, the body's framing, the authority and the absolute URI).
The parsers that put them together are http_proxy.py's; malformed input
raises `HttpProxyError`, and nothing else.
"""
from __future__ import annotations

import re

from stages.startup.records import NamedTuple   # not dataclasses: the loop's import (records.py)

MAX_REQUEST_LINE = 8 * 1024
MAX_HEADERS_BYTES = 64 * 1024
MAX_HEADERS = 100
MAX_RESPONSE_HEADERS = 256       # origins are less tidy than clients
MAX_CHUNK_LINE = 4 * 1024
MAX_BODY_EVENT = 256 * 1024      # a Body event never holds more than this

HOST_HEADER = frozenset({b"host"})      # the forwarder writes Host itself, from the URI

# Hop-by-hop: meaningful for one connection only, never passed on.
HOP_BY_HOP = frozenset({
    b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization",
    b"proxy-authenticate", b"te", b"upgrade",
})

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
METHOD = _TOKEN
VERSION = re.compile(rb"HTTP/1\.[01]\Z")
STATUS_LINE = re.compile(rb"(HTTP/1\.[01]) ([0-9]{3})(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?\Z")
BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_PORT = re.compile(rb"[0-9]{1,5}\Z")
# Bytes >= 0x80 pass (as UTF-8) so that decide.parse_target refuses a
# non-ASCII name as a denial, the same as the SOCKS door does.
_HOST_CHARS = re.compile(rb"[A-Za-z0-9._~!$&'()*+,;=%\x80-\xff-]*\Z")
_IPV6_CHARS = re.compile(rb"[0-9A-Fa-f:.%A-Za-z_-]+\Z")
HEX = re.compile(rb"[0-9A-Fa-f]{1,16}\Z")


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



class HttpProxyError(Exception):
    """Malformed or unsupported HTTP; `status` is the answer to give."""

    def __init__(self, reason: str, status: int = 400):
        super().__init__(reason)
        self.reason = reason
        self.status = status


def split_lines(head: bytes) -> list[bytes]:
    # Accept CRLF and bare LF line ends (as h11 does); a bare CR is an error,
    # since a parser that disagrees with the origin about line ends can be
    # made to smuggle a request. (A CR that ends the head's last line ends it.)
    text = head.replace(b"\r\n", b"\n")
    if text.endswith(b"\r"):
        text = text[:-1]
    if b"\r" in text:
        raise HttpProxyError("bare CR in the head")
    return text.split(b"\n")



def split_request_line(request_line: bytes) -> tuple[bytes, bytes, bytes]:
    """(method, target, version) of a request line, each checked: what both
    the HTTP door's and a secret door's parsers read first."""
    parts = request_line.split(b" ")
    if len(parts) != 3:
        raise HttpProxyError("malformed request line")
    method, target, version = parts
    if not METHOD.match(method):
        raise HttpProxyError("malformed method")
    if not VERSION.match(version):
        raise HttpProxyError("unsupported HTTP version", 505)
    if not target or BAD_VALUE.search(target) or b"\t" in target:
        raise HttpProxyError("malformed request target")
    return method, target, version

# Every line of a header block well formed (a token, a colon, a value with no
# control character but tab): the common case, checked in one match; the
# line-by-line loop below then only runs to say what is wrong.
_WELL_FORMED_HEADERS = re.compile(
    rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*(?:\n|\Z))*\Z")


def parse_headers(lines: list[bytes], max_headers: int) -> list[tuple[bytes, bytes]]:
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
        if BAD_VALUE.search(value):
            raise HttpProxyError("control character in a header value")
        headers.append((name, value))
    return headers


# The functions below take the header names lower-cased once, beside the
# headers themselves (`names[i]` is `headers[i]`'s name, lower case).

def connection_tokens(headers, names: list[bytes]) -> set[bytes]:
    tokens = set()
    for name, (_, value) in zip(names, headers):
        if name == b"connection" or name == b"proxy-connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def strip_hop_by_hop(headers, names: list[bytes], tokens: set[bytes], also: frozenset = frozenset()):
    drop = HOP_BY_HOP | tokens | also
    return [header for name, header in zip(names, headers) if name not in drop]


def keeps_alive(version: bytes, tokens: set[bytes]) -> bool:
    """RFC 9112 9.3: HTTP/1.1 persists unless "close"; HTTP/1.0 only with "keep-alive"."""
    if version == b"HTTP/1.0":
        return b"keep-alive" in tokens
    return b"close" not in tokens


def body_framing(headers, names: list[bytes], *, is_request: bool) -> tuple[str, int]:
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


def parse_absolute_uri(target: bytes) -> tuple[str, int, bytes, bytes]:
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


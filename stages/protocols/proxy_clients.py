"""Sans-I/O clients for the proxy protocols vpnw speaks to an exit: SOCKS5
(RFC 1928, RFC 1929 auth) and HTTP CONNECT (plus the `OPTIONS *` probe).

Bytes in, events out; anything malformed from the other side raises
`ExitProtocolError` and nothing else. Each client also says how many bytes it
may read next (`bytes_needed`) without reading past the end of its reply, so
the socket can be handed to a relay with no tunnel byte swallowed.

Shared vocabulary: the broker dials exits with these (stages/broker/upstream.py)
and the ssh relay (stages/inside/ssh_proxy.py) reaches the sandbox's SOCKS5 door with
the same client. Light imports only: the relay starts once per ssh connection.
"""
from __future__ import annotations

import base64
import ipaddress
import re
import struct
from dataclasses import dataclass


class ExitProtocolError(Exception):
    """The exit's reply is not valid for the protocol we speak with it."""


@dataclass(frozen=True)
class Send:
    """Bytes the client must send to the exit now."""
    data: bytes


@dataclass(frozen=True)
class Authenticated:
    """SOCKS5: greeting (and username/password) accepted; ready for CONNECT."""


@dataclass(frozen=True)
class AuthRefused:
    """The exit refused our credentials, or wants credentials we lack."""
    message: str


@dataclass(frozen=True)
class Connected:
    """The exit reached the destination; from here on the stream is the tunnel."""
    bound: str


@dataclass(frozen=True)
class ConnectFailed:
    """The exit answered, but could not (or would not) reach the destination."""
    code: int          # SOCKS5 reply code, or HTTP status
    message: str


@dataclass(frozen=True)
class Answered:
    """HTTP probe: the proxy answered `OPTIONS *` itself with this status."""
    status: int
    reason: str


SOCKS5_REPLIES = {
    1: "general SOCKS server failure",
    2: "connection not allowed by the exit's rules",
    3: "network unreachable",
    4: "host unreachable",
    5: "connection refused",
    6: "TTL expired",
    7: "command not supported",
    8: "address type not supported",
}

_NO_AUTH, _USER_PASS, _NO_METHOD = 0x00, 0x02, 0xFF


def _target_bytes(host: str) -> bytes:
    """SOCKS5 DST.ADDR: an address as an address, a name as a name."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        name = host.encode("idna") if not host.isascii() else host.encode("ascii")
        if not 0 < len(name) < 256 or any(c in name for c in b"\x00\r\n "):
            raise ValueError("a SOCKS5 destination name must be 1-255 plain bytes")
        return bytes([3, len(name)]) + name
    return (b"\x01" if address.version == 4 else b"\x04") + address.packed


class Socks5Client:
    """The client side of a SOCKS5 CONNECT (RFC 1928) with RFC 1929 auth.

    Use: `start()` -> bytes to send; feed replies to `receive()` reading at most
    `bytes_needed` at a time; on Authenticated, `connect(host, port)` -> bytes;
    then receive() until Connected / ConnectFailed.
    """

    def __init__(self, username: str | None = None, password: str | None = None):
        if (username is None) != (password is None):
            raise ValueError("username and password go together")
        self._username = username
        self._password = password
        self._state = "new"
        self._buffer = b""

    def start(self) -> bytes:
        if self._state != "new":
            raise ValueError("start() once")
        self._state = "method"
        methods = bytes([_NO_AUTH, _USER_PASS]) if self._username is not None else bytes([_NO_AUTH])
        return bytes([5, len(methods)]) + methods

    def connect(self, host: str, port: int) -> bytes:
        if self._state != "ready":
            raise ValueError("connect() only after Authenticated")
        if not 0 < port < 65536:
            raise ValueError("port out of range")
        self._state = "reply"
        return b"\x05\x01\x00" + _target_bytes(host) + struct.pack(">H", port)

    @property
    def bytes_needed(self) -> int:
        """How many bytes can be read now without reading past this reply."""
        buffered = len(self._buffer)
        if self._state in ("method", "auth"):
            return 2 - buffered
        if self._state == "reply":
            if buffered < 4:
                return 4 - buffered
            length = self._reply_length()
            return 1 if length is None else max(length - buffered, 0)
        return 0

    def _reply_length(self) -> int | None:
        """Length of the whole success reply, or None until it can be known."""
        atyp = self._buffer[3]
        if atyp == 1:
            return 4 + 4 + 2
        if atyp == 4:
            return 4 + 16 + 2
        if atyp == 3 and len(self._buffer) >= 5:
            return 4 + 1 + self._buffer[4] + 2
        return None

    def receive(self, data: bytes) -> list:
        if not data:
            return []
        if self._state in ("new", "ready", "done", "failed"):
            raise ExitProtocolError("the exit sent data when no reply was due")
        self._buffer += data
        events: list = []
        while True:
            if self._state == "method" and len(self._buffer) >= 2:
                version, method = self._buffer[0], self._buffer[1]
                self._buffer = self._buffer[2:]
                if version != 5:
                    raise ExitProtocolError(f"the exit does not speak SOCKS5 (version byte {version})")
                if method == _NO_AUTH:
                    self._state = "ready"
                    events.append(Authenticated())
                elif method == _USER_PASS and self._username is not None:
                    self._state = "auth"
                    user = self._username.encode()
                    secret = self._password.encode()
                    events.append(Send(bytes([1, len(user)]) + user + bytes([len(secret)]) + secret))
                elif method == _NO_METHOD:
                    self._state = "failed"
                    if self._username is None:
                        message = "the exit accepts no unauthenticated clients (it wants credentials)"
                    else:
                        message = "the exit accepts neither no-auth nor username/password"
                    events.append(AuthRefused(message))
                else:
                    raise ExitProtocolError(f"the exit chose method {method}, which was not offered")
            elif self._state == "auth" and len(self._buffer) >= 2:
                version, status = self._buffer[0], self._buffer[1]
                self._buffer = self._buffer[2:]
                # RFC 1929 says version 1; some servers answer 5. Both are unambiguous.
                if version not in (1, 5):
                    raise ExitProtocolError(f"bad username/password reply version {version}")
                if status == 0:
                    self._state = "ready"
                    events.append(Authenticated())
                else:
                    self._state = "failed"
                    events.append(AuthRefused("the exit refused the username/password"))
            elif self._state == "reply" and len(self._buffer) >= 4:
                version, code, reserved = self._buffer[0], self._buffer[1], self._buffer[2]
                if version != 5:
                    raise ExitProtocolError(f"the exit's reply has version byte {version}")
                if reserved != 0:
                    raise ExitProtocolError("the exit's reply has a non-zero reserved byte")
                if code != 0:
                    # Failure replies are often short or carry junk addresses; the
                    # connection is over anyway, so the code is all we need.
                    self._state = "failed"
                    self._buffer = b""
                    events.append(ConnectFailed(code, SOCKS5_REPLIES.get(code, f"unknown reply code {code}")))
                    return events
                if self._buffer[3] not in (1, 3, 4):
                    raise ExitProtocolError(f"the exit's reply has an unknown address type {self._buffer[3]}")
                length = self._reply_length()
                if length is None or len(self._buffer) < length:
                    break
                reply, self._buffer = self._buffer[:length], self._buffer[length:]
                events.append(Connected(self._bound(reply)))
                self._state = "done"
            else:
                break
        if self._buffer and self._state in ("ready", "done", "failed"):
            raise ExitProtocolError("the exit sent more bytes than its reply")
        return events

    @staticmethod
    def _bound(reply: bytes) -> str:
        atyp = reply[3]
        port = struct.unpack(">H", reply[-2:])[0]
        if atyp == 3:
            name = reply[5:-2].decode("ascii", "replace")
            return f"{name}:{port}"
        address = ipaddress.ip_address(reply[4:-2])
        return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9])(?: ([\t\x20-\x7e\x80-\xff]*))?\Z")
_HEADER_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*\Z")
MAX_HEAD = 16384


def _basic(username: str, password: str) -> bytes:
    return base64.b64encode(f"{username}:{password}".encode())


def _authority(host: str, port: int) -> bytes:
    try:
        address = ipaddress.ip_address(host)
        text = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,253}", host):
            raise ValueError("an HTTP CONNECT destination must be a plain host name or address")
        text = f"{host}:{port}"
    return text.encode("ascii")


class HttpConnectClient:
    """The client side of an HTTP proxy CONNECT (or the OPTIONS * probe).

    `connect(host, port)` or `probe(proxy_host, proxy_port)` -> bytes to send;
    feed the reply to `receive()` reading at most `bytes_needed` at a time. A
    2xx answer to CONNECT has no body (RFC 9110 9.3.6), so the tunnel starts
    right after the blank line and `bytes_needed` never reads past it.
    """

    def __init__(self, username: str | None = None, password: str | None = None):
        if (username is None) != (password is None):
            raise ValueError("username and password go together")
        self._auth = (b"Proxy-Authorization: Basic " + _basic(username, password) + b"\r\n"
                      if username is not None else b"")
        self._mode = None
        self._buffer = b""

    def connect(self, host: str, port: int) -> bytes:
        if self._mode is not None:
            raise ValueError("one request per client")
        if not 0 < port < 65536:
            raise ValueError("port out of range")
        self._mode = "connect"
        authority = _authority(host, port)
        return (b"CONNECT " + authority + b" HTTP/1.1\r\nHost: " + authority + b"\r\n"
                + self._auth + b"\r\n")

    def probe(self, proxy_host: str, proxy_port: int) -> bytes:
        if self._mode is not None:
            raise ValueError("one request per client")
        self._mode = "probe"
        return (b"OPTIONS * HTTP/1.1\r\nHost: " + _authority(proxy_host, proxy_port)
                + b"\r\nMax-Forwards: 0\r\nContent-Length: 0\r\n" + self._auth
                + b"Connection: close\r\n\r\n")

    @property
    def bytes_needed(self) -> int:
        if self._mode in (None, "done"):
            return 0
        # The head ends with CRLFCRLF; reading only as many bytes as could
        # complete it never takes a tunnel byte.
        for suffix, need in ((b"\r\n\r", 1), (b"\r\n", 2), (b"\r", 3)):
            if self._buffer.endswith(suffix):
                return need
        return 4

    def receive(self, data: bytes) -> list:
        if not data:
            return []
        if self._mode in (None, "done"):
            raise ExitProtocolError("the exit sent data when no reply was due")
        self._buffer += data
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    raise ExitProtocolError("the exit's reply head is too long")
                return []
            head, rest = self._buffer[:end], self._buffer[end + 4:]
            status, reason = self._parse_head(head)
            if 100 <= status < 200:
                # An interim answer; the real one follows.
                self._buffer = rest
                continue
            if rest and self._mode == "connect" and 200 <= status < 300:
                raise ExitProtocolError("the exit sent more bytes than its reply")
            mode, self._mode = self._mode, "done"
            self._buffer = b""
            if mode == "probe":
                if status in (401, 407):
                    return [AuthRefused(self._auth_message(status))]
                return [Answered(status, reason)]
            if 200 <= status < 300:
                return [Connected("")]
            if status in (401, 407):
                return [AuthRefused(self._auth_message(status))]
            return [ConnectFailed(status, f"{status} {reason}".strip())]

    def _auth_message(self, status: int) -> str:
        if self._auth:
            return f"the exit refused the username/password ({status})"
        return f"the exit wants a username and password ({status})"

    @staticmethod
    def _parse_head(head: bytes) -> tuple[int, str]:
        lines = head.split(b"\r\n")
        match = _STATUS_LINE.match(lines[0])
        if not match:
            raise ExitProtocolError("the exit did not answer with an HTTP/1.x status line")
        for line in lines[1:]:
            if not _HEADER_LINE.match(line):
                raise ExitProtocolError("the exit's reply has a malformed header line")
        # The exit's own reason phrase is never used: a message is built only
        # from parts vpnw knows (the status and its standard phrase), so no
        # text the exit chose, such as an echo of our credentials, reaches one.
        status = int(match.group(1))
        return status, _standard_phrase(status)


def _standard_phrase(status: int) -> str:
    from http import HTTPStatus    # only for an exit's refusal: http's enum (~0.7 ms, loaded machine) off the dial's way
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "(a status HTTP does not define)"

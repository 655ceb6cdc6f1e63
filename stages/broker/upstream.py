"""Upstream: reaching a destination through the chosen path.

Two halves:

* Sans-I/O clients for the exits' protocols (`Socks5Client`, `HttpConnectClient`):
  bytes in, events out. Anything malformed from the exit raises
  `ExitProtocolError` and nothing else. Each client also says how many bytes it
  may read next (`bytes_needed`) without reading past the end of its reply, so
  the socket can be handed to the relay with no tunnel byte swallowed.
* A thin asyncio shell (`check_path`, `dial_via`) on a non-blocking socket
  (`loop.sock_connect/sock_recv/sock_sendall`, not streams: the broker relays
  the raw socket afterwards with splice).

Fail closed: a proxy path only ever dials its exit. If the exit is gone, the
dial fails with "path-down"; nothing here ever dials the destination directly
for a proxy path.

The path check and what it can prove:

* SOCKS5: TCP connect, greeting, and the username/password exchange when the
  path has credentials; then close. No CONNECT is sent, so the exit dials
  nothing. A refused password is found here.
* HTTP without credentials: `OPTIONS * HTTP/1.1` with `Max-Forwards: 0`. The
  asterisk form addresses the proxy itself and Max-Forwards: 0 forbids
  forwarding (RFC 9110 9.3.7, 7.6.2), so the proxy answers on its own and dials
  nothing. Any well-formed HTTP answer proves the exit is there and speaks HTTP.
* HTTP with credentials: `CONNECT <the exit's own host:port>` with
  Proxy-Authorization. squid answers OPTIONS (501) before it checks credentials,
  so OPTIONS cannot reveal a bad password there, while every proxy
  authenticates a CONNECT. 407 (or 401, which tinyproxy sends for a bad
  password) means the credentials were refused; any other answer means they
  passed. The only thing the exit may dial is its own listening address (a
  tunnel that is closed at once), never a destination of the program's.
"""
from __future__ import annotations

import asyncio
import base64
import errno
import ipaddress
import re
import socket
import struct
from dataclasses import dataclass

from stages.paths import PathSpec


# ===================== sans-I/O clients ======================================

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
        reason = (match.group(2) or b"").decode("latin-1")
        reason = "".join(c if c.isprintable() else "?" for c in reason)[:80]
        return int(match.group(1)), reason


# ===================== asyncio shell ==========================================

class PathDown(Exception):
    """The chosen path does not answer; the program must not start (exit 123)."""


class DialError(Exception):
    """A destination could not be reached through the path.

    code: refused, unreachable, timeout, path-down, denied-by-exit, bad-reply.
    """

    CODES = ("refused", "unreachable", "timeout", "path-down", "denied-by-exit", "bad-reply")

    def __init__(self, code: str, reason: str):
        if code not in self.CODES:
            raise ValueError(f"unknown dial error code {code!r}")
        self.code = code
        self.reason = reason
        super().__init__(code, reason)

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


class _ExitGone(Exception):
    """Could not reach, or lost, the exit itself."""


def _scrub(text: str, path: PathSpec) -> str:
    """Remove the password (and its Basic token) from text the exit influenced."""
    if path.password:
        text = text.replace(path.password, "***")
        if path.username is not None:
            text = text.replace(_basic(path.username, path.password).decode(), "***")
    return text


_SOCKS_CODE_TO_DIAL = {1: "unreachable", 2: "denied-by-exit", 3: "unreachable", 4: "unreachable",
                       5: "refused", 6: "timeout", 7: "denied-by-exit", 8: "denied-by-exit"}


def _http_code_to_dial(status: int) -> str:
    if status in (403, 405):
        return "denied-by-exit"
    if status == 504:
        return "timeout"
    # 502/503/500: the exit tried and failed; HTTP does not say why.
    return "unreachable" if status >= 500 else "denied-by-exit"


def _os_error_code(exc: OSError) -> str:
    if exc.errno == errno.ECONNREFUSED:
        return "refused"
    if exc.errno in (errno.ETIMEDOUT,):
        return "timeout"
    return "unreachable"


async def _open_socket(loop, address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, (address, port))
    except BaseException:
        sock.close()
        raise
    return sock


async def _connect_exit(loop, path: PathSpec) -> socket.socket:
    """A TCP connection to the exit (the proxy), never to the destination."""
    try:
        addresses = [str(ipaddress.ip_address(path.host))]
    except ValueError:
        try:
            infos = await loop.getaddrinfo(path.host, path.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise _ExitGone(f"cannot resolve the exit's name {path.host}: {exc.strerror}") from None
        addresses = list(dict.fromkeys(info[4][0] for info in infos))
    last = "no address"
    for address in addresses:
        try:
            return await _open_socket(loop, address, path.port)
        except OSError as exc:
            last = f"{address}:{path.port}: {exc.strerror or exc}"
    raise _ExitGone(f"cannot connect to the exit ({last})")


async def _converse(loop, sock: socket.socket, client) -> list:
    """Read, exactly as much as the client allows, until it reports events."""
    while True:
        need = client.bytes_needed
        if need <= 0:
            raise ExitProtocolError("no reply is due")
        try:
            data = await loop.sock_recv(sock, need)
        except OSError as exc:
            raise _ExitGone(f"the exit's connection failed: {exc.strerror or exc}") from None
        if not data:
            raise _ExitGone("the exit closed the connection before it answered")
        events = client.receive(data)
        sends = [e for e in events if isinstance(e, Send)]
        for event in sends:
            await loop.sock_sendall(sock, event.data)
        rest = [e for e in events if not isinstance(e, Send)]
        if rest:
            return rest


async def _socks5_session(loop, path: PathSpec, sock: socket.socket) -> Socks5Client:
    client = Socks5Client(path.username, path.password)
    await loop.sock_sendall(sock, client.start())
    events = await _converse(loop, sock, client)
    if isinstance(events[0], AuthRefused):
        raise _Refused(events[0].message)
    return client


class _Refused(Exception):
    """Credentials refused by the exit."""


async def check_path(path: PathSpec, timeout: float = 5.0) -> None:
    """Prove the path answers before the program starts; raises PathDown."""
    if path.type == "direct":
        return
    loop = asyncio.get_running_loop()
    sock = None
    try:
        async with asyncio.timeout(timeout):
            sock = await _connect_exit(loop, path)
            if path.scheme in ("socks5", "socks5h"):
                await _socks5_session(loop, path, sock)
            else:
                client = HttpConnectClient(path.username, path.password)
                if path.username is None:
                    request = client.probe(path.host, path.port)
                else:
                    # squid answers OPTIONS (501) before it checks credentials but
                    # authenticates every CONNECT; a CONNECT to the exit itself is one
                    # whose destination it surely knows. Any answer but 401/407 means
                    # the credentials passed; a tunnel opened is closed at once.
                    request = client.connect(path.host, path.port)
                await loop.sock_sendall(sock, request)
                events = await _converse(loop, sock, client)
                if isinstance(events[0], AuthRefused):
                    raise _Refused(events[0].message)
    except TimeoutError:
        raise PathDown(f"path {path.describe()} is down: no answer within {timeout:g} s") from None
    except _ExitGone as exc:
        raise PathDown(_scrub(f"path {path.describe()} is down: {exc}", path)) from None
    except _Refused as exc:
        raise PathDown(_scrub(f"path {path.describe()}: {exc}", path)) from None
    except ExitProtocolError as exc:
        kind = "a SOCKS5 proxy" if path.scheme.startswith("socks") else "an HTTP proxy"
        raise PathDown(_scrub(f"path {path.describe()}: the exit does not answer as {kind} ({exc})",
                              path)) from None
    except OSError as exc:
        raise PathDown(f"path {path.describe()} is down: {exc.strerror or type(exc).__name__}") from None
    finally:
        if sock is not None:
            sock.close()


async def _dial_direct(loop, port: int, targets: list[str]) -> tuple[socket.socket, str]:
    failures = []
    for address in targets:
        try:
            return await _open_socket(loop, address, port), address
        except OSError as exc:
            failures.append((_os_error_code(exc), f"{address}: {exc.strerror or exc}"))
    code = failures[-1][0] if failures else "unreachable"
    raise DialError(code, "; ".join(f for _, f in failures) or "no address to dial")


async def _dial_socks5_once(loop, path: PathSpec, target: str, port: int) -> socket.socket:
    sock = await _connect_exit(loop, path)
    try:
        client = await _socks5_session(loop, path, sock)
        await loop.sock_sendall(sock, client.connect(target, port))
        events = await _converse(loop, sock, client)
        event = events[0]
        if isinstance(event, ConnectFailed):
            raise DialError(_SOCKS_CODE_TO_DIAL.get(event.code, "unreachable"),
                            f"the exit could not reach {target}:{port}: {event.message}")
        return sock
    except BaseException:
        sock.close()
        raise


async def _dial_http_once(loop, path: PathSpec, target: str, port: int) -> socket.socket:
    sock = await _connect_exit(loop, path)
    try:
        client = HttpConnectClient(path.username, path.password)
        await loop.sock_sendall(sock, client.connect(target, port))
        events = await _converse(loop, sock, client)
        event = events[0]
        if isinstance(event, AuthRefused):
            raise _Refused(event.message)
        if isinstance(event, ConnectFailed):
            raise DialError(_http_code_to_dial(event.code),
                            _scrub(f"the exit could not reach {target}:{port}: it answered {event.message}",
                                   path))
        return sock
    except BaseException:
        sock.close()
        raise


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


async def dial_via(path: PathSpec, host: str, port: int, addresses: tuple,
                   timeout: float = 10.0) -> tuple[socket.socket, str]:
    """Connect to host:port through `path`.

    Returns a connected non-blocking socket whose next byte is the
    destination's, and the address reached, for the record ("140.82.112.6"; the
    host name itself when the exit resolves it). For direct and socks5:// the checked `addresses` are dialled (or
    sent to the exit), first to last, never the name; for socks5h:// and http://
    the name goes to the exit, which resolves it. Raises DialError.
    """
    loop = asyncio.get_running_loop()
    targets = [str(a) for a in addresses] or ([_literal(host)] if _literal(host) else [])
    try:
        async with asyncio.timeout(timeout):
            if path.type == "direct":
                return await _dial_direct(loop, port, targets)
            if path.scheme == "socks5":
                if not targets:
                    raise DialError("unreachable", f"{host}: no checked address to send to {path.describe()}")
                last: DialError | None = None
                for target in targets:
                    try:
                        return await _dial_socks5_once(loop, path, target, port), target
                    except DialError as exc:
                        last = exc
                raise last
            name = _literal(host) or host
            if path.scheme == "socks5h":
                sock = await _dial_socks5_once(loop, path, name, port)
            else:
                sock = await _dial_http_once(loop, path, name, port)
            return sock, name
    except TimeoutError:
        raise DialError("timeout", f"no connection through {path.describe()} within {timeout:g} s") from None
    except _ExitGone as exc:
        raise DialError("path-down", _scrub(f"path {path.describe()} is down: {exc}", path)) from None
    except _Refused as exc:
        raise DialError("path-down", _scrub(f"path {path.describe()}: {exc}", path)) from None
    except ExitProtocolError as exc:
        raise DialError("bad-reply", _scrub(f"path {path.describe()}: bad reply from the exit ({exc})",
                                            path)) from None
    except OSError as exc:
        # A send to the exit failed (e.g. it reset the connection).
        raise DialError("path-down", f"path {path.describe()}: {exc.strerror or type(exc).__name__}") from None

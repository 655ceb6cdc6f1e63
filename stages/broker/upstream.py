"""Upstream: reaching a destination through a proxy path (the dial contract's
`ProxyDialer`, see dial.py).

A thin asyncio shell (`check_path`, `dial_via`) on a non-blocking socket
(`loop.sock_connect/sock_recv/sock_sendall`, not streams: the broker relays the
raw socket afterwards with splice) around the sans-I/O clients for the exits'
protocols (`Socks5Client`, `HttpConnectClient`), which live in the shared
vocabulary (stages/protocols/proxy_clients.py).

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
import ipaddress
import socket

# The sans-I/O clients live in the shared vocabulary; re-exported here for the
# broker's callers and tests.
from stages.protocols.proxy_clients import (  # noqa: F401
    MAX_HEAD, SOCKS5_REPLIES, Answered, Authenticated, AuthRefused, Connected, ConnectFailed,
    ExitProtocolError, HttpConnectClient, Send, Socks5Client, _basic,
)
from stages.config.paths import PathSpec

from stages.broker.dial import DialError, PathDownError


# ===================== asyncio shell ==========================================

class ProxyDialer:
    """The dial contract (dial.py) for a proxy path: every connection goes to
    the exit, never to the destination."""
    kind = "proxy"
    resolve = None                      # names are the exit's to resolve, or the machine's
    own_addresses: frozenset = frozenset()

    def __init__(self, path: PathSpec):
        self.path = path
        self.resolves_at_exit = path.resolves_at_exit

    async def check(self) -> None:
        await check_path(self.path)

    async def dial(self, host: str, port: int, addresses: tuple) -> tuple[socket.socket, str]:
        return await dial_via(self.path, host, port, addresses)


class _ExitGone(Exception):
    """Could not reach, or lost, the exit itself."""


# An exit's answer -> the record's dial error. The exit refusing to connect
# (its rules, a bad command) is "refused", as the destination refusing is; the
# reason says which.
_SOCKS_CODE_TO_DIAL = {1: "unreachable", 2: "refused", 3: "unreachable", 4: "unreachable",
                       5: "refused", 6: "timeout", 7: "refused", 8: "refused"}


def _http_code_to_dial(status: int) -> str:
    if status == 504:
        return "timeout"
    # 502/503/500: the exit tried and failed; HTTP does not say why.
    return "unreachable" if status >= 500 else "refused"


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
    """Prove the proxy path answers before the program starts; raises PathDownError."""
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
    # The text follows "the path 'NAME' is down: " (and the path's DOWN line),
    # which name the path: it says where the path leads and what went wrong.
    except TimeoutError:
        raise PathDownError(f"{path.exit_text()}: no answer within {timeout:g} s") from None
    except (_ExitGone, _Refused) as exc:
        raise PathDownError(f"{path.exit_text()}: {exc}") from None
    except ExitProtocolError as exc:
        kind = "a SOCKS5 proxy" if path.scheme.startswith("socks") else "an HTTP proxy"
        raise PathDownError(f"{path.exit_text()}: the exit does not answer as {kind} ({exc})") from None
    except OSError as exc:
        raise PathDownError(f"{path.exit_text()}: {exc.strerror or type(exc).__name__}") from None
    finally:
        if sock is not None:
            sock.close()


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
                            f"the exit could not reach {target}:{port}: it answered {event.message}")
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
    """Connect to host:port through the proxy path `path`.

    Returns a connected non-blocking socket whose next byte is the
    destination's, and the address reached, for the record ("140.82.112.6"; the
    host name itself when the exit resolves it). For socks5:// the checked
    `addresses` are sent to the exit, first to last, never the name; for
    socks5h:// and http:// the name goes to the exit, which resolves it.
    Raises DialError (the record's codes).
    """
    if path.type != "proxy":
        raise ValueError(f"dial_via dials through a proxy path, not {path.type!r} (see dial.dialer_for)")
    loop = asyncio.get_running_loop()
    targets = [str(a) for a in addresses] or ([_literal(host)] if _literal(host) else [])
    try:
        async with asyncio.timeout(timeout):
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
        raise DialError("path-down", f"path {path.describe()} is down: {exc}") from None
    except _Refused as exc:
        raise DialError("path-down", f"path {path.describe()}: {exc}") from None
    except ExitProtocolError as exc:
        raise DialError("path-down", f"path {path.describe()}: bad reply from the exit ({exc})") from None
    except OSError as exc:
        # A send to the exit failed (e.g. it reset the connection).
        raise DialError("path-down", f"path {path.describe()}: {exc.strerror or type(exc).__name__}") from None

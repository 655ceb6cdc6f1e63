"""The dial contract: one interface per kind of path, one error type.

Every kind of path (direct here; proxy in upstream.py; WireGuard in wireguard/) is a
`Dialer`: `check()` proves the path answers before the program starts
(raises PathDownError: exit 123), `dial(host, port, addresses)` returns a
connected non-blocking socket and the address reached, or raises DialError,
whose `error` is already the record's conn.fail code. `dialer_for(path)`
picks the one for a path.

`dial_direct` tries exactly the addresses it is given, in order (they are the
addresses the policy checked: no second lookup), each with a non-blocking
connect bounded by a timeout.
"""
from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from collections.abc import Awaitable, Callable

CONNECT_TIMEOUT = 10.0
_IP_TYPES = (ipaddress.IPv4Address, ipaddress.IPv6Address)

# conn.fail's "error" (docs/architecture.md, stages/record/schema.json) for a dial.
DIAL_ERRORS = ("refused", "unreachable", "timeout", "dns", "path-down", "internal", "tls")


class DialError(Exception):
    """The destination could not be reached. `error` is the record's short
    code (DIAL_ERRORS); `reason` a sentence for people, never a password."""

    def __init__(self, error: str, reason: str):
        if error not in DIAL_ERRORS:
            raise ValueError(f"unknown dial error {error!r}")
        super().__init__(error, reason)
        self.error = error
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class PathDownError(Exception):
    """The chosen path does not answer; the program must not start (exit 123)."""


class Dialer:
    """What every kind of path gives the broker (direct here, ProxyDialer in
    upstream.py, WireGuardDialer in wireguard/dialer.py): an interface, as
    typing.Protocol would say, without typing's import (~4 ms of CPU) on
    the way to the first connection."""
    kind: str                          # the path's type, as the record names it
    resolves_at_exit: bool             # names go to the exit unresolved (socks5h://, http://)
    # Looks a name up the path's own way (the office's DNS through a tunnel):
    # async (host) -> (addresses, server); None: the machine's resolver.
    resolve: Callable[[str], Awaitable[tuple[tuple, str]]] | None
    own_addresses: frozenset           # the path's own addresses (a tunnel's), this run's like the machine's

    async def check(self) -> None: ...   # raises PathDownError: exit 123, the program never starts

    async def dial(self, host: str, port: int, addresses: tuple) -> tuple[socket.socket, str]: ...


class DirectDialer:
    """The direct path: connect from this machine to the checked addresses."""
    kind = "direct"
    resolves_at_exit = False
    resolve = None
    own_addresses: frozenset = frozenset()

    async def check(self) -> None:
        """Nothing to check: this machine's own network."""

    async def dial(self, host: str, port: int, addresses: tuple) -> tuple[socket.socket, str]:
        return await dial_direct(addresses, port)


def classify(exc: BaseException) -> str:
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, OSError) and exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH,
                                                   errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT,
                                                   errno.ENETDOWN, errno.EHOSTDOWN):
        return "unreachable"
    if isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT:
        return "timeout"
    if isinstance(exc, ConnectionError):
        return "refused"
    return "internal"


async def _connect(loop, sock: socket.socket, address: tuple, timeout: float) -> None:
    """A non-blocking connect: one writer callback and one timer, no task
    (loop.sock_connect under wait_for costs a task, a future and a resolve
    step per dial). Raises as loop.sock_connect does."""
    err = sock.connect_ex(address)
    if err == 0:
        return
    if err not in (errno.EINPROGRESS, errno.EINTR):
        raise OSError(err, f"Connect call failed {address}")
    # On loopback and other local paths the handshake has usually completed
    # inside connect() already: no need to wait a loop turn for writability.
    try:
        sock.getpeername()
        return
    except OSError:
        pass
    fd = sock.fileno()
    done = loop.create_future()

    def on_writable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_writer(fd, on_writable)
    try:
        async with asyncio.timeout(timeout):
            await done
    finally:
        loop.remove_writer(fd)
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err != 0:
        raise OSError(err, f"Connect call failed {address}")


async def dial_direct(addresses, port: int, *, timeout: float = CONNECT_TIMEOUT,
                      make_socket=None) -> tuple[socket.socket, str]:
    """Connect to the first of `addresses` that answers -> (socket, address).

    `make_socket(family)` (async): where the socket comes from when it must be
    made elsewhere (the WireGuard path's namespace); it raises DialError."""
    loop = asyncio.get_running_loop()
    last: BaseException | None = None
    if not addresses:
        raise DialError("dns", "the name has no addresses")
    for address in addresses:
        # The policy's addresses are already parsed: parse only text.
        ip = address if isinstance(address, _IP_TYPES) else ipaddress.ip_address(address)
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        if make_socket is None:
            # Non-blocking from its creation: no ioctl.
            try:
                sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
            except OSError as exc:
                # Out of descriptors (a program holding many connections): a
                # failure of this connection, said as such, not of vpnw's code.
                raise DialError("internal", f"vpnw could not open a socket for it: "
                                            f"{exc.strerror or exc}") from None
        else:
            sock = await make_socket(family)
            sock.setblocking(False)
        text = str(ip)
        try:
            await _connect(loop, sock, (text, port), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            sock.close()
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, text
    code = classify(last)
    what = {"refused": "connection refused", "timeout": "timed out",
            "unreachable": "unreachable"}.get(code, str(last))
    tried = ", ".join(str(a) for a in addresses[:4])
    raise DialError(code, f"{tried} port {port}: {what}")

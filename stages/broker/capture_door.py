"""The capture door (docs/architecture.md "Capture"): a connection the
sandbox's nftables table redirected here. The program asked for another
address; the kernel's conntrack kept it, and SO_ORIGINAL_DST (IPv4) or
IP6T_SO_ORIGINAL_DST (IPv6) gives it back, even from outside the sandbox (a
socket keeps its network namespace, and so its conntrack, wherever its
descriptor goes). From there it is a door connection like the others:
decided by the policy, dialled through the path, relayed by splice,
recorded (`conn.request` with door and kind "capture").

The program's connect() has already succeeded when the door sees it. A
refused one is answered in its own protocol where the first bytes the
program sends show it (docs/architecture.md "Denials at every door"): a TLS
ClientHello gets the alert access_denied in the clear (stages/protocols/tls_hello.py),
a plain HTTP request the HTTP door's 403 with the reason; anything else
(and a failed connection) is ended with a reset (SO_LINGER 0), so the
program reads ECONNRESET rather than an orderly end of a reply.
"""
from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import struct

from stages.broker import http_proxy
from stages.broker.connector import Denied, Opened
from stages.broker.sessions import _Door
from stages.protocols import tls_hello

SO_ORIGINAL_DST = 80          # linux/netfilter_ipv4.h, on SOL_IP
IP6T_SO_ORIGINAL_DST = 80     # linux/netfilter_ipv6/ip6_tables.h, on SOL_IPV6
_SOCKADDR_IN = struct.Struct("!2xH4s8x")
_SOCKADDR_IN6 = struct.Struct("!2xH4x16s4x")
# How long a refused connection's first bytes are waited for: a client that
# speaks first (TLS, HTTP) has sent them with its connect; one that waits
# for the server (SMTP, a database) gets the reset after this.
FIRST_BYTES_WAIT = 3.0
MAX_HEAD = 64 * 1024
# A request line begins with a method, a space and the target's first
# character; bytes that could still become one are waited for.
_REQUEST_LINE = re.compile(rb"[A-Z]{3,10} [^ \r\n]")
_REQUEST_LINE_SO_FAR = re.compile(rb"[A-Z]{1,10} ?")


class NoOriginalDestination(Exception):
    pass


def parse_original_destination(family: int, raw: bytes) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """sockaddr_in / sockaddr_in6 bytes -> (address, port). Pure."""
    try:
        if family == socket.AF_INET:
            port, packed = _SOCKADDR_IN.unpack(raw[:_SOCKADDR_IN.size])
            return ipaddress.IPv4Address(packed), port
        if family == socket.AF_INET6:
            port, packed = _SOCKADDR_IN6.unpack(raw[:_SOCKADDR_IN6.size])
            return ipaddress.IPv6Address(packed), port
    except struct.error:
        raise NoOriginalDestination(f"a {len(raw)}-byte original destination") from None
    raise NoOriginalDestination(f"address family {family}")


def original_destination(sock: socket.socket):
    """The address and port the program asked for (conntrack's record of the
    redirect); NoOriginalDestination when there is none (not redirected)."""
    try:
        if sock.family == socket.AF_INET:
            raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, _SOCKADDR_IN.size)
        else:
            raw = sock.getsockopt(socket.IPPROTO_IPV6, IP6T_SO_ORIGINAL_DST, _SOCKADDR_IN6.size)
    except OSError as e:
        raise NoOriginalDestination(e.strerror or str(e)) from None
    return parse_original_destination(sock.family, raw)


def reset(sock: socket.socket) -> None:
    """End the program's connection with a RST when it is closed."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


class CaptureDoor(_Door):
    """A redirected connection: no handshake, the destination is the kernel's word."""

    async def serve(self, client: socket.socket) -> None:
        self.ctx.handshaking.discard(client)
        try:
            address, port = original_destination(client)
        except NoOriginalDestination as exc:
            reset(client)
            self.journal.handshake_failed("bad-request", f"a connection at the capture door without "
                                                         f"an original destination ({exc})")
            return
        conn = self.journal.new_conn()
        # An address the DNS door made up becomes its name in connect().
        outcome = await self.connector.connect(conn, "capture", "capture", str(address), port, client)
        if not isinstance(outcome, Opened):
            if not (isinstance(outcome, Denied) and await self._answer_refusal(client, outcome)):
                reset(client)
            return
        await self.tunnel(client, outcome)

    async def _answer_refusal(self, client: socket.socket, denied: Denied) -> bool:
        """Say the refusal in the program's protocol; False: not one we can
        answer in (the caller resets). The reason is the DENY line's."""
        deadline = self.ctx.loop.time() + FIRST_BYTES_WAIT
        data = b""
        try:
            while True:
                chunk = await self.recv(client, deadline)
                if not chunk:
                    return False
                data += chunk
                answer = refusal_answer(data, denied)
                if answer is None:
                    continue
                if answer == b"":
                    return False
                await self.send_quietly(client, answer)
                break
        except (OSError, asyncio.TimeoutError):
            return False
        # An orderly end: FIN after the answer, and what the program still
        # sends read and dropped (closing with unread bytes would reset the
        # connection and could lose the answer before the program reads it).
        try:
            client.shutdown(socket.SHUT_WR)
            end = self.ctx.loop.time() + 1.0
            while await self.recv(client, end):
                pass
        except (OSError, asyncio.TimeoutError):
            pass
        return True


def refusal_answer(first: bytes, denied: Denied) -> bytes | None:
    """Pure: what a refused captured connection is answered with, from the
    first bytes the program sent. The answer's bytes; None: more bytes are
    needed to tell; b"": none (a reset)."""
    if tls_hello.looks_like_tls(first[:2]):
        try:
            hello = tls_hello.read_client_hello(first)
        except tls_hello.NotClientHello:
            return b""
        return None if hello is None else tls_hello.ACCESS_DENIED_ALERT
    if _REQUEST_LINE.match(first[:12]) is None:
        return None if len(first) < 12 and _REQUEST_LINE_SO_FAR.fullmatch(first) else b""
    if b"\r\n\r\n" not in first and b"\n\n" not in first:
        return None if len(first) < MAX_HEAD else b""
    return http_proxy.denied_response(denied)

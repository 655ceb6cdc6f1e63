"""The capture door (docs/architecture.md "Capture"): a connection the
sandbox's nftables table redirected here. The program asked for another
address; the kernel's conntrack kept it, and SO_ORIGINAL_DST (IPv4) or
IP6T_SO_ORIGINAL_DST (IPv6) gives it back, even from outside the sandbox (a
socket keeps its network namespace, and so its conntrack, wherever its
descriptor goes). From there it is a door connection like the others:
decided by the policy, dialled through the path, relayed by splice,
recorded (`conn.request` with door and kind "capture").

The program's connect() has already succeeded when the door sees it, so a
denied or failed connection can only be ended: with a reset (SO_LINGER 0),
so the program reads ECONNRESET rather than an orderly end of a reply.
"""
from __future__ import annotations

import ipaddress
import socket
import struct

from stages.broker.connector import Opened
from stages.broker.sessions import _Door

SO_ORIGINAL_DST = 80          # linux/netfilter_ipv4.h, on SOL_IP
IP6T_SO_ORIGINAL_DST = 80     # linux/netfilter_ipv6/ip6_tables.h, on SOL_IPV6
_SOCKADDR_IN = struct.Struct("!2xH4s8x")
_SOCKADDR_IN6 = struct.Struct("!2xH4x16s4x")


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
            self.journal.fail(self.journal.new_conn(), "handshake", "bad-request",
                              f"a connection at the capture door without an original "
                              f"destination ({exc})")
            return
        conn = self.journal.new_conn()
        # An address the DNS door made up becomes its name in connect().
        outcome = await self.connector.connect(conn, "capture", "capture", str(address), port, client)
        if not isinstance(outcome, Opened):
            reset(client)
            return
        try:
            await self.run_relay(client, outcome)
        finally:
            self.journal.close_conn(outcome)

"""The DNS door (docs/architecture.md "The DNS door"): the resolver the
sandbox's /etc/resolv.conf names, 127.0.0.1:53 over UDP and TCP, answered
here and never forwarded. Nothing is ever looked up for a query, so a query
carries nothing out of the sandbox (no DNS tunnel through query names).

    A       a made-up address from this run's pool (fake_ips.py), for every
            name a door would take, whatever the policy says of it: the
            policy decides the name and the port when the program connects
            (at any door), and answering gave nothing away
    AAAA    NODATA (no IPv6 made-up addresses: clients fall back to the A)
    ANY, AXFR, IXFR, and any class but IN: REFUSED
    others  NODATA (TXT, MX, SRV, HTTPS...: nothing to tell)
    names the policy refuses at every port, by name alone (a deny rule
    without a port, deny_private's special names, localhost and the names
    below it, a default of deny no allow rule names; decide.name_refusal):
    answered as any name (the made-up address, NODATA), with the doors'
    reason as an Extended DNS Error (RFC 8914, info-code 15 "Blocked") when
    the query has EDNS: dig prints it; a program connects and meets the
    refusal in its own protocol, with the reason (capture_door.py). Not
    REFUSED: glibc reads that as "Temporary failure in name resolution" and
    Go as "server misbehaving", a network fault that invites a retry
    other special names (RFC 6761, .local, .internal, metadata hosts, single
    labels: the deny_private list): NXDOMAIN; names a door would refuse
    (non-ASCII, all digits, odd spellings): REFUSED

Every answer is one `dns.answer` event. `answer()` is pure: bytes in, the
reply and the event's fields out.
"""
from __future__ import annotations

import asyncio
import socket
import struct

from stages.config.addresses import BadHost, classify_name, parse_host
from stages.record import event_types as ev
from stages.protocols import dns
from stages.broker.fake_ips import FakeNames, PoolFull
from stages.broker.sessions import _Door

REFUSED_TYPES = {252, 251, 255}     # AXFR, IXFR, ANY
UDP_BATCH = 64                      # datagrams read per wake-up (the loop stays fair)
TCP_IDLE = 10.0                     # seconds a DNS-over-TCP client may sit between queries
TCP_MAX_QUERIES = 100               # per connection


def answer(data: bytes, names: FakeNames, transport: str,
           refusal=None) -> tuple[bytes | None, ev.DnsAnswer | None]:
    """(reply or None, the dns.answer event or None). None, None: not a
    query at all (an answer, or shorter than a header): dropped unanswered
    and unrecorded, as a resolver does. `refusal`: name -> the reason the
    policy refuses it at every port, or None (Connector.name_refusal)."""
    try:
        query = dns.parse_query(data)
    except dns.DnsQueryError as exc:
        if exc.query_id is None:
            return None, None
        rcode = dns.NOTIMP if "standard" in str(exc) else dns.FORMERR
        return (dns.build_error(exc.query_id, exc.flags, rcode),
                ev.DnsAnswer(name="", type="", transport=transport, rcode=dns.RCODE_NAMES[rcode],
                             reason=f"not a query the DNS door reads: {exc}"))
    shown = b".".join(query.labels).decode("ascii", "backslashreplace")
    rcode, addresses, reason, refused = _decide(query, names, refusal)
    event = ev.DnsAnswer(name=shown[:253], type=query.type_name, transport=transport,
                         rcode=dns.RCODE_NAMES[rcode] if rcode or addresses else "NODATA",
                         address=str(addresses[0]) if addresses else None, reason=reason or None)
    error = (dns.EDE_BLOCKED, f"vpnw: {shown[:253]} denied: {reason}") if refused else None
    return dns.build_response(query, rcode, addresses, error=error), event


def _decide(query: dns.Query, names: FakeNames, refusal=None) -> tuple[int, tuple, str | None, bool]:
    """(rcode, addresses, reason, refused by the policy)."""
    if query.qclass != 1:
        return dns.REFUSED, (), "only class IN is answered", False
    if query.qtype in REFUSED_TYPES:
        return dns.REFUSED, (), f"{query.type_name} queries are never answered", False
    try:
        text = b".".join(query.labels).decode("ascii")
        host = parse_host(text) if text else None
    except (UnicodeDecodeError, BadHost) as exc:
        reason = "a name that is not ASCII" if isinstance(exc, UnicodeDecodeError) else str(exc)
        return dns.REFUSED, (), f"refused as at the doors: {reason}", False
    if not isinstance(host, str):
        return dns.REFUSED, (), "an address or the root is not a name to look up", False
    why = refusal(host) if refusal is not None else None
    special = classify_name(host)
    if special and why is None:
        return dns.NXDOMAIN, (), f"a special name, never the internet's: {special}", False
    if query.qtype != dns.A:
        return dns.NOERROR, (), why, why is not None
    try:
        return dns.NOERROR, (names.address_for(host),), why, why is not None
    except PoolFull as exc:
        return dns.SERVFAIL, (), str(exc), False


class DnsDatagrams:
    """The UDP side: one socket, read in batches by the loop's reader."""

    def __init__(self, ctx, sock: socket.socket):
        self.ctx = ctx          # sessions.DoorContext
        self.sock = sock

    def on_readable(self) -> None:
        self.serve_batch(UDP_BATCH)

    def serve_batch(self, most: int | None) -> None:
        """Answer up to `most` (None: all) datagrams waiting."""
        served = 0
        while most is None or served < most:
            try:
                data, peer = self.sock.recvfrom(dns.MAX_QUERY)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            served += 1
            reply, event = answer(data, self.ctx.fake_names, "udp", self.ctx.connector.name_refusal)
            if event is not None:
                self.ctx.journal.emit(event)
            if reply is not None:       # at most ~290 bytes: one question, one A record
                try:
                    self.sock.sendto(reply, peer)
                except OSError:
                    pass


class DnsTcpDoor(_Door):
    """DNS over TCP (RFC 7766): two-byte length, then the query; answers in order."""

    async def serve(self, client: socket.socket) -> None:
        self.ctx.handshaking.discard(client)
        buffered = b""
        for _ in range(TCP_MAX_QUERIES):
            while len(buffered) < 2 or len(buffered) < 2 + struct.unpack_from("!H", buffered)[0]:
                try:
                    chunk = await self.recv(client, self.ctx.loop.time() + TCP_IDLE)
                except (OSError, asyncio.TimeoutError):
                    return
                if not chunk:
                    return
                buffered += chunk
            size = struct.unpack_from("!H", buffered)[0]
            data, buffered = buffered[2:2 + size], buffered[2 + size:]
            reply, event = answer(data, self.ctx.fake_names, "tcp", self.connector.name_refusal)
            if event is not None:
                self.journal.emit(event)
            if reply is None:
                return
            try:
                await self.ctx.loop.sock_sendall(client, struct.pack("!H", len(reply)) + reply)
            except OSError:
                return

"""DNS on the wire, sans-I/O: the query vpnw sends to the WireGuard path's
own DNS server (the .conf's `DNS =`) through the tunnel, and the reading of
its answer. Only what a lookup needs: one question (A or AAAA), the answer
section's records of that type; CNAME chains are followed by the server.
"""
from __future__ import annotations

import ipaddress
import struct

A, AAAA = 1, 28
_RCODES = {1: "format error", 2: "server failure", 3: "no such name", 4: "not implemented",
           5: "refused"}


class DnsAnswerError(Exception):
    """The answer is not usable; str() says why (a sentence)."""


def build_query(query_id: int, name: str, qtype: int) -> bytes:
    """A recursive query for `name` (IDNA-encoded ASCII) of type A or AAAA."""
    labels = name.rstrip(".").encode("idna").split(b".")
    if any(not 0 < len(label) < 64 for label in labels):
        raise DnsAnswerError(f"{name!r} is not a valid DNS name")
    qname = b"".join(bytes([len(label)]) + label for label in labels) + b"\0"
    return struct.pack("!HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", qtype, 1)


def _skip_name(data: bytes, at: int) -> int:
    for _ in range(128):
        if at >= len(data):
            raise DnsAnswerError("the answer is cut short")
        length = data[at]
        if length == 0:
            return at + 1
        if length & 0xC0 == 0xC0:
            return at + 2
        at += 1 + length
    raise DnsAnswerError("a name in the answer is too long")


def parse_answer(data: bytes, query_id: int, qtype: int) -> list:
    """The addresses of type `qtype` in the answer; [] for 'no such name'
    or no records. Raises DnsAnswerError for anything else wrong."""
    if len(data) < 12:
        raise DnsAnswerError("the answer is shorter than a DNS header")
    ident, flags, qdcount, ancount, _, _ = struct.unpack("!HHHHHH", data[:12])
    if ident != query_id or not flags & 0x8000:
        raise DnsAnswerError("the answer does not match the query")
    if flags & 0x0200:
        raise DnsAnswerError("the answer was truncated (TCP is not supported)")
    rcode = flags & 0xF
    if rcode == 3:
        return []
    if rcode:
        raise DnsAnswerError(f"the server answered {_RCODES.get(rcode, f'rcode {rcode}')}")
    at = 12
    for _ in range(qdcount):
        at = _skip_name(data, at) + 4
    found = []
    for _ in range(ancount):
        at = _skip_name(data, at)
        if at + 10 > len(data):
            raise DnsAnswerError("the answer is cut short")
        rtype, rclass, _, length = struct.unpack("!HHIH", data[at:at + 10])
        at += 10
        rdata = data[at:at + length]
        if len(rdata) != length:
            raise DnsAnswerError("the answer is cut short")
        at += length
        if rclass == 1 and rtype == qtype == A and length == 4:
            found.append(ipaddress.IPv4Address(rdata))
        elif rclass == 1 and rtype == qtype == AAAA and length == 16:
            found.append(ipaddress.IPv6Address(rdata))
    return found

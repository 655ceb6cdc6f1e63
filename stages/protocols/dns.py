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


# ------------------------------------------------- the DNS door's side (queries in)

NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 2, 3, 4, 5
RCODE_NAMES = {NOERROR: "NOERROR", FORMERR: "FORMERR", SERVFAIL: "SERVFAIL", NXDOMAIN: "NXDOMAIN",
               NOTIMP: "NOTIMP", REFUSED: "REFUSED"}
TYPE_NAMES = {1: "A", 2: "NS", 5: "CNAME", 6: "SOA", 12: "PTR", 15: "MX", 16: "TXT", 28: "AAAA",
              33: "SRV", 65: "HTTPS", 252: "AXFR", 251: "IXFR", 255: "ANY"}
MAX_QUERY = 512 + 4096      # a plain query is far smaller; EDNS options make it a little larger


class DnsQueryError(Exception):
    """Not a query the door can read; `.query_id` is set when a FORMERR can
    still be sent back (the header was readable)."""

    def __init__(self, reason: str, query_id: int | None = None, flags: int = 0):
        super().__init__(reason)
        self.query_id = query_id
        self.flags = flags


class Query(tuple):
    """One question: (query_id, flags, labels (raw bytes), qtype, qclass,
    question bytes, edns: the client's UDP payload size when it sent an OPT
    record (RFC 6891), else None)."""
    __slots__ = ()

    def __new__(cls, query_id, flags, labels, qtype, qclass, question, edns=None):
        return tuple.__new__(cls, (query_id, flags, labels, qtype, qclass, question, edns))

    query_id = property(lambda self: self[0])
    flags = property(lambda self: self[1])
    labels = property(lambda self: self[2])
    qtype = property(lambda self: self[3])
    qclass = property(lambda self: self[4])
    question = property(lambda self: self[5])
    edns = property(lambda self: self[6])

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.qtype, f"TYPE{self.qtype}")


def parse_query(data: bytes) -> Query:
    """A standard query with exactly one question (compression in it refused).
    Raises DnsQueryError for anything else; never any other exception."""
    if len(data) < 12:
        raise DnsQueryError("shorter than a DNS header")
    query_id, flags, qdcount, ancount, nscount, _arcount = struct.unpack_from("!HHHHHH", data)
    if flags & 0x8000:
        raise DnsQueryError("an answer, not a query")
    if (flags >> 11) & 0xF != 0:
        raise DnsQueryError("not a standard query", query_id, flags)
    if qdcount != 1 or ancount or nscount:
        raise DnsQueryError("not exactly one question", query_id, flags)
    labels, at = [], 12
    while True:
        if at >= len(data):
            raise DnsQueryError("the question is cut short", query_id, flags)
        length = data[at]
        if length == 0:
            at += 1
            break
        if length & 0xC0:
            raise DnsQueryError("a compressed or extended label in the question", query_id, flags)
        labels.append(data[at + 1: at + 1 + length])
        at += 1 + length
        if len(labels[-1]) != length or at > 12 + 255:
            raise DnsQueryError("the question's name is cut short or too long", query_id, flags)
    if at + 4 > len(data):
        raise DnsQueryError("the question is cut short", query_id, flags)
    qtype, qclass = struct.unpack_from("!HH", data, at)
    return Query(query_id, flags, tuple(labels), qtype, qclass, data[12:at + 4],
                 _edns(data, at + 4, _arcount))


OPT = 41
EDE = 15                      # the EDNS option code of an Extended DNS Error (RFC 8914)
EDE_BLOCKED, EDE_PROHIBITED = 15, 18
MAX_EDE_TEXT = 300            # bytes of EXTRA-TEXT: the answer stays under 512 bytes


def _edns(data: bytes, at: int, arcount: int) -> int | None:
    """The UDP payload size of the OPT record among the additional records
    (the root name, type 41), or None. A query whose additional section
    cannot be read is answered as one without EDNS."""
    for _ in range(min(arcount, 8)):
        if at >= len(data):
            return None
        if data[at] != 0:            # OPT's owner is the root; skip any other owner name
            try:
                at = _skip_name(data, at)
            except DnsAnswerError:
                return None
        else:
            at += 1
        if at + 10 > len(data):
            return None
        rtype, rclass, _, length = struct.unpack_from("!HHIH", data, at)
        if rtype == OPT:
            return max(rclass, 512)
        at += 10 + length
    return None


def build_response(query: Query, rcode: int, addresses=(), ttl: int = 1,
                   error: tuple[int, str] | None = None) -> bytes:
    """The answer to `query`: its question echoed, `rcode`, and an A or AAAA
    record per address (NODATA: NOERROR with none). Recursion is shown as
    available so stub resolvers take the answer as final. A query with EDNS
    gets an OPT record back, carrying `error` = (info-code, text) as an
    Extended DNS Error (RFC 8914) when given; without EDNS there is no
    place for it (RFC 8914 §2)."""
    flags = 0x8000 | (query.flags & 0x0100) | 0x0080 | (rcode & 0xF)
    answers = b""
    for address in addresses:
        packed = address.packed
        rtype = A if len(packed) == 4 else AAAA
        answers += b"\xc0\x0c" + struct.pack("!HHIH", rtype, 1, ttl, len(packed)) + packed
    additional = b""
    if query.edns is not None:
        options = b""
        if error is not None:
            code, text = error
            extra = text.encode("utf-8", "replace")[:MAX_EDE_TEXT]
            extra = extra.decode("utf-8", "ignore").encode("utf-8")     # never half a character
            options = struct.pack("!HHH", EDE, 2 + len(extra), code) + extra
        additional = b"\0" + struct.pack("!HHIH", OPT, 1232, 0, len(options)) + options
    return (struct.pack("!HHHHHH", query.query_id, flags, 1, len(addresses), 0, 1 if additional else 0)
            + query.question + answers + additional)


def build_error(query_id: int, flags: int, rcode: int) -> bytes:
    """An answer with no question (FORMERR, or NOTIMP for another opcode)."""
    return struct.pack("!HHHHHH", query_id, 0x8000 | (flags & 0x7900) | 0x0080 | (rcode & 0xF),
                       0, 0, 0, 0)

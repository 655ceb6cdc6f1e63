"""The sans-I/O DNS query and answer reader used through the WireGuard path."""
import ipaddress
import struct

import pytest

from stages.protocols.dns import A, AAAA, DnsAnswerError, build_query, parse_answer
from stages.protocols import dns

from dns_support import extended_error


def answer(query: bytes, records, rcode=0, flags=0x8180):
    header = struct.pack("!HHHHHH", struct.unpack("!H", query[:2])[0], flags | rcode, 1, len(records), 0, 0)
    body = query[12:]
    for rtype, rdata in records:
        body += b"\xc0\x0c" + struct.pack("!HHIH", rtype, 1, 60, len(rdata)) + rdata
    return header + body


def test_a_query_has_one_question_and_asks_for_recursion():
    q = build_query(0x1234, "tracker.office.internal", A)
    assert q[:12] == struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    assert q[12:] == b"\x07tracker\x06office\x08internal\x00" + struct.pack("!HH", A, 1)


def test_addresses_of_the_asked_type_are_read_and_others_skipped():
    q = build_query(7, "x.example", A)
    data = answer(q, [(5, b"\x01y\x00"), (A, bytes([10, 66, 0, 1])), (AAAA, bytes(16)),
                      (A, bytes([10, 66, 0, 9]))])
    assert parse_answer(data, 7, A) == [ipaddress.ip_address("10.66.0.1"), ipaddress.ip_address("10.66.0.9")]
    q6 = build_query(8, "x.example", AAAA)
    assert parse_answer(answer(q6, [(AAAA, bytes(15) + b"\x01")]), 8, AAAA) == [ipaddress.ip_address("::1")]


def test_no_such_name_is_no_addresses_and_failures_say_why():
    q = build_query(9, "gone.example", A)
    assert parse_answer(answer(q, [], rcode=3), 9, A) == []
    with pytest.raises(DnsAnswerError, match="refused"):
        parse_answer(answer(q, [], rcode=5), 9, A)
    with pytest.raises(DnsAnswerError, match="does not match"):
        parse_answer(answer(q, []), 10, A)
    with pytest.raises(DnsAnswerError, match="truncated"):
        parse_answer(answer(q, [], flags=0x8380), 9, A)
    with pytest.raises(DnsAnswerError, match="cut short"):
        parse_answer(answer(q, [(A, bytes([1, 2, 3, 4]))])[:-2], 9, A)
    with pytest.raises(DnsAnswerError):
        parse_answer(b"\x00" * 5, 9, A)


# --- Extended DNS Errors (RFC 8914), issue 44 ---------------------------------

def _query(name: str, edns: bool) -> bytes:
    q = dns.build_query(0x4444, name, dns.A)
    if not edns:
        return q
    # arcount 1, then an OPT record: root owner, type 41, payload 1232.
    return q[:10] + b"\x00\x01" + q[12:] + b"\x00" + struct.pack("!HHIH", 41, 1232, 0, 0)


def test_an_edns_query_gets_the_reason_as_an_extended_error():
    query = dns.parse_query(_query("evil.example", edns=True))
    assert query.edns == 1232
    reply = dns.build_response(query, dns.REFUSED, error=(dns.EDE_BLOCKED, "vpnw: evil.example denied: why"))
    assert reply[3] & 0xF == dns.REFUSED
    assert extended_error(reply) == (15, "vpnw: evil.example denied: why")
    assert len(reply) < 512


def test_without_edns_there_is_no_place_for_the_reason():
    query = dns.parse_query(_query("evil.example", edns=False))
    assert query.edns is None
    reply = dns.build_response(query, dns.REFUSED, error=(dns.EDE_BLOCKED, "why"))
    assert struct.unpack("!H", reply[10:12])[0] == 0 and extended_error(reply) is None


def test_a_long_reason_is_cut_on_a_character_boundary():
    query = dns.parse_query(_query("evil.example", edns=True))
    reply = dns.build_response(query, dns.REFUSED, error=(dns.EDE_BLOCKED, "é" * 400))
    code, text = extended_error(reply)
    assert code == 15 and text == "é" * (dns.MAX_EDE_TEXT // 2)

"""The sans-I/O DNS query and answer reader used through the WireGuard path."""
import ipaddress
import struct

import pytest

from stages.wire.dns import A, AAAA, DnsAnswerError, build_query, parse_answer


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

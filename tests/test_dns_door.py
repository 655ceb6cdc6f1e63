"""The DNS door's pure parts: the made-up address pool (stages/broker/fake_ips.py)
and the answer to every kind of query (stages/broker/dns_door.py), byte by
byte through the one DNS wire module (stages/protocols/dns.py)."""
from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import given, settings, strategies as st

from stages.broker import dns_door
from stages.broker.fake_ips import POOL, SLOT_SIZE, SLOTS, FakeNames, PoolFull
from stages.protocols import dns
from dns_support import extended_error
from stages.broker.decide import name_refusal
from stages.config.policy import Policy, parse_policy


def pool(start: int = 0) -> FakeNames:
    return FakeNames(memory=bytearray(SLOTS * SLOT_SIZE), start=start)


def answer(*args):
    """dns_door.answer, its dns.answer event as the line's fields."""
    reply, event = dns_door.answer(*args)
    return reply, None if event is None else event.fields()


def query(name: str | bytes, qtype: int = dns.A, qclass: int = 1, qid: int = 0x1234) -> bytes:
    raw = name if isinstance(name, bytes) else name.encode()
    qname = b"".join(bytes([len(l)]) + l for l in raw.split(b".") if l) + b"\0"
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", qtype, qclass)


def test_pool_gives_one_address_per_name_and_maps_it_back():
    names = pool(start=5)
    a = names.address_for("api.github.com")
    assert a == ipaddress.IPv4Address("198.18.0.5") and a in POOL
    assert names.address_for("api.github.com") == a
    b = names.address_for("pypi.org")
    assert b != a
    assert names.name_for(a) == "api.github.com" and names.name_for(b) == "pypi.org"
    assert names.name_for(ipaddress.ip_address("::ffff:198.18.0.5")) == "api.github.com"
    # Another address of the pool this run did not give, and one outside it.
    assert names.name_for(ipaddress.ip_address("198.19.255.254")) is None
    assert names.name_for(ipaddress.ip_address("140.82.112.6")) is None


def test_pool_wraps_and_is_bounded():
    names = pool(start=SLOTS - 1)
    assert names.address_for("a.example") == ipaddress.IPv4Address("198.19.255.255")
    assert names.address_for("b.example") == ipaddress.IPv4Address("198.18.0.0")
    names.given = {f"n{i}": None for i in range(SLOTS)}
    with pytest.raises(PoolFull):
        names.address_for("one.more")


def test_a_query_gets_a_made_up_address_and_the_record_says_so():
    names = pool()
    reply, fields = answer(query("API.GitHub.com"), names, "udp")
    assert fields == {"name": "API.GitHub.com", "type": "A", "transport": "udp", "rcode": "NOERROR",
                      "address": "198.18.0.0"}
    assert dns.parse_answer(reply, 0x1234, dns.A) == [ipaddress.IPv4Address("198.18.0.0")]
    assert names.name_for(ipaddress.IPv4Address("198.18.0.0")) == "api.github.com"
    # The question is echoed as asked (0x20 case), recursion shown available.
    assert b"\x03API\x06GitHub\x03com\x00" in reply and struct.unpack_from("!H", reply, 2)[0] & 0x0080


@pytest.mark.parametrize("qtype, rcode", [(dns.AAAA, "NODATA"), (16, "NODATA"), (15, "NODATA"),
                                          (65, "NODATA"), (255, "REFUSED"), (252, "REFUSED"),
                                          (251, "REFUSED")])
def test_other_types_get_nothing(qtype, rcode):
    names = pool()
    reply, fields = answer(query("api.github.com", qtype), names, "tcp")
    assert fields["rcode"] == rcode and "address" not in fields
    flags, qd, an = struct.unpack_from("!HHH", reply, 2)
    assert flags & 0xF == (dns.REFUSED if rcode == "REFUSED" else dns.NOERROR) and (qd, an) == (1, 0)
    assert names.given == {}      # nothing given, nothing looked up


@pytest.mark.parametrize("name, rcode", [
    ("localhost", "NXDOMAIN"), ("printer.local", "NXDOMAIN"), ("metadata.google.internal", "NXDOMAIN"),
    ("intranet", "NXDOMAIN"), ("2130706433", "REFUSED"), ("0x7f.1", "REFUSED"),
    (b"caf\xc3\xa9.example", "REFUSED"), ("1.2.3.4", "REFUSED")])
def test_special_and_odd_names_get_no_address(name, rcode):
    names = pool()
    reply, fields = answer(query(name), names, "udp")
    assert fields["rcode"] == rcode and fields.get("reason"), fields
    flags, _qd, an = struct.unpack_from("!HHH", reply, 2)
    assert (dns.RCODE_NAMES[flags & 0xF], an) == (rcode, 0), (flags, an)
    if rcode == "NXDOMAIN":
        assert dns.parse_answer(reply, 0x1234, dns.A) == []
    else:
        with pytest.raises(dns.DnsAnswerError, match="refused"):
            dns.parse_answer(reply, 0x1234, dns.A)
    assert names.given == {}


def test_class_other_than_in_is_refused():
    _reply, fields = answer(query("api.github.com", dns.A, qclass=3), pool(), "udp")
    assert fields["rcode"] == "REFUSED"


def test_not_a_query():
    assert answer(b"\x00" * 5, pool(), "udp") == (None, None)
    answer_bit = bytearray(query("a.example"))
    answer_bit[2] |= 0x80
    assert answer(bytes(answer_bit), pool(), "udp") == (None, None)
    two = bytearray(query("a.example"))
    two[5] = 2
    reply, fields = answer(bytes(two), pool(), "udp")
    assert fields["rcode"] == "FORMERR" and struct.unpack_from("!H", reply, 2)[0] & 0xF == dns.FORMERR


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_an_answer_or_nothing_never_an_exception(data):
    reply, fields = answer(data, pool(), "udp")
    assert (reply is None) == (fields is None)


# --- a name the policy refuses at every port: the reason as an Extended DNS Error -----

def _edns(data: bytes) -> bytes:
    return data[:10] + b"\x00\x01" + data[12:] + b"\x00" + struct.pack("!HHIH", 41, 1232, 0, 0)


POLICY = parse_policy('version = 1\n[policy]\ndefault = "deny"\n'
                      'allow = ["api.github.com:443", "*.pythonhosted.org"]\ndeny = ["*.example"]\n',
                      "agent.toml")


@pytest.mark.parametrize("name, said", [
    ("evil.example", 'evil.example matches deny rule "*.example" (agent.toml line 5)'),
    ("tracker.net", "no allow rule matches tracker.net; default is deny"),
    ("localhost", "vpnw never dials for the program"),
])
def test_a_refused_name_carries_the_reason_as_an_extended_error(name, said):
    """Answered as any name (REFUSED reads as "Temporary failure in name
    resolution" to glibc, "server misbehaving" to Go), the reason in an
    Extended DNS Error 15 "Blocked" when the query has EDNS; the program
    then meets the refusal at the connection, with the same reason."""
    names = pool()

    def refusal(host):
        return name_refusal(host, POLICY)
    reply, fields = answer(_edns(query(name)), names, "udp", refusal)
    assert fields["rcode"] == "NOERROR" and fields["address"] and said in fields["reason"], fields
    code, text = extended_error(reply)
    assert code == dns.EDE_BLOCKED and text.startswith(f"vpnw: {name} denied: ") and said in text
    assert names.name_for(ipaddress.ip_address(fields["address"])) == name
    # Another type: NODATA, with the reason all the same.
    reply, fields = answer(_edns(query(name, 16)), names, "udp", refusal)
    assert fields["rcode"] == "NODATA" and extended_error(reply)[0] == dns.EDE_BLOCKED
    # Without EDNS there is no place for it.
    reply, fields = answer(query(name), names, "udp", refusal)
    assert fields["rcode"] == "NOERROR" and extended_error(reply) is None


@pytest.mark.parametrize("name", ["api.github.com", "files.pythonhosted.org"])
def test_a_name_some_port_allows_still_gets_an_address(name):
    names = pool()
    reply, fields = answer(_edns(query(name)), names, "udp", lambda h: name_refusal(h, POLICY))
    assert fields["rcode"] == "NOERROR" and fields["address"], fields
    assert extended_error(reply) is None


def test_a_name_that_does_not_exist_stays_nxdomain():
    reply, fields = answer(_edns(query("printer.local")), pool(), "udp",
                                    lambda h: name_refusal(h, Policy.allow_all()))
    assert fields["rcode"] == "NXDOMAIN" and extended_error(reply) is None

"""Pure parts of the helper: the filter's rules and the seal check."""
from __future__ import annotations

import socket
import struct

from hypothesis import given, strategies as st

from stages.helper import netlink
from stages.helper.seccomp_rules import (AF_INET, AF_INET6, AF_NETLINK, AF_UNIX,
                                         complement_patterns, filter_rules)


def refused(patterns, v):
    return any(v & m == val for m, val in patterns)


@given(st.sets(st.integers(0, 2**32 - 1), max_size=5), st.integers(0, 2**64 - 1))
def test_complement_patterns_refuse_exactly_the_values_not_allowed(allowed, value):
    pats = complement_patterns(allowed, 32)
    assert refused(pats, value) == ((value & 0xFFFFFFFF) not in allowed)


def test_socket_rules_look_only_at_the_low_32_bits():
    pats = [r.args[0][1:] for r in filter_rules(False) if r.syscall == "socket"]
    for fam in (AF_INET, AF_INET6, AF_NETLINK):
        assert not refused(pats, fam) and not refused(pats, fam | 1 << 32)
    for fam in (0, AF_UNIX, 40, 17, 0x100000001, 0xFFFFFFFF):
        assert refused(pats, fam)
    unix_ok = [r.args[0][1:] for r in filter_rules(True) if r.syscall == "socket"]
    assert not refused(unix_ok, AF_UNIX) and refused(unix_ok, 40)


def test_allow_unix_sockets_drops_only_unix_rules():
    strict = {r for r in filter_rules(False) if r.syscall not in ("socket", "socketpair")}
    loose = {r for r in filter_rules(True) if r.syscall not in ("socket", "socketpair")}
    assert strict == loose
    assert not [r for r in filter_rules(True) if r.syscall == "socketpair"]


def _link(index, name):
    attr = name.encode() + b"\0"
    return struct.pack("=BxHiII", 0, 0, index, 0, 0) + struct.pack("=HH", 4 + len(attr), 3) + attr + b"\0" * ((-len(attr)) % 4)


def _route(family, dst, dst_len, rtype, oif, table=255):
    body = struct.pack("=BBBBBBBBI", family, dst_len, 0, 0, table, 2, 254, rtype, 0)
    if dst is not None:
        raw = socket.inet_pton(family, dst)
        body += struct.pack("=HH", 4 + len(raw), 1) + raw
    if oif is not None:
        body += struct.pack("=HHi", 8, 4, oif)
    return body


def test_fresh_namespace_passes_the_seal_check():
    links = [netlink.parse_link(_link(1, "lo"))]
    routes = [netlink.parse_route(_route(socket.AF_INET, "127.0.0.0", 8, 2, 1)),
              netlink.parse_route(_route(socket.AF_INET, "127.255.255.255", 32, 3, 1)),
              netlink.parse_route(_route(socket.AF_INET6, "::1", 128, 2, 1))]
    assert netlink.seal_problems(links, routes) == []


def test_anything_else_fails_the_seal_check():
    lo = netlink.parse_link(_link(1, "lo"))
    veth = netlink.parse_link(_link(2, "veth0"))
    assert netlink.seal_problems([lo, veth], [])
    for bad in (_route(socket.AF_INET, None, 0, 1, 1, 254),          # default via lo
                _route(socket.AF_INET, "10.0.0.0", 8, 1, 1, 254),     # not loopback space
                _route(socket.AF_INET6, "2001:db8::", 32, 1, 1, 254),
                _route(socket.AF_INET, "127.0.0.0", 8, 2, 2),         # another interface
                _route(socket.AF_INET, "192.0.2.0", 24, 6, None)):    # no interface at all
        assert netlink.seal_problems([lo], [netlink.parse_route(bad)]), bad


@given(st.binary(max_size=200))
def test_netlink_parsers_raise_only_netlink_error(data):
    for parse in (netlink.parse_link, netlink.parse_route, netlink.split_messages):
        try:
            parse(data)
        except netlink.NetlinkError:
            pass

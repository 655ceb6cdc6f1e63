"""Pure parts of the helper: the filter's rules and the seal check."""
from __future__ import annotations

import errno
import socket
import struct

import pytest
from hypothesis import given, strategies as st

from stages.helper import netlink
from stages.helper.seccomp_rules import (
    AF_INET, AF_INET6, AF_NETLINK, AF_UNIX, SOCK_STREAM, complement_patterns, filter_rules,
)


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
    assert not [r for r in filter_rules(True) if r.syscall == "socketpair" and len(r.args) > 1]


SOCK_DGRAM, SOCK_RAW, SOCK_SEQPACKET = 2, 3, 5
SOCK_NONBLOCK, SOCK_CLOEXEC = 0o4000, 0o2000000


def _socketpair_refusal(rules, family, sock_type):
    """The errno the socketpair rules give (family, type), or None: what the
    BPF program does, with masked equalities over the 64-bit arguments."""
    for r in rules:
        if r.syscall == "socketpair" and all(
                ((family, sock_type)[i] & mask) == value for i, mask, value in r.args):
            return r.errno_
    return None


@pytest.mark.parametrize("flags", [0, SOCK_CLOEXEC, SOCK_NONBLOCK, SOCK_CLOEXEC | SOCK_NONBLOCK])
def test_stream_and_seqpacket_pairs_pass_with_any_flags_datagram_ones_do_not(flags):
    rules = filter_rules(False)
    for family in (AF_UNIX, AF_UNIX | 1 << 32):
        assert _socketpair_refusal(rules, family, SOCK_STREAM | flags) is None
        assert _socketpair_refusal(rules, family, SOCK_SEQPACKET | flags) is None
        # SOCK_RAW is AF_UNIX's alias for SOCK_DGRAM; 4 and 6..15 are no pair
        # the kernel makes, refused all the same.
        for refused_type in (0, SOCK_DGRAM, SOCK_RAW, 4, *range(6, 16)):
            assert _socketpair_refusal(rules, family, refused_type | flags) == errno.EPERM, refused_type


def test_socketpair_families_follow_the_socket_rule_plus_unix():
    for allow_unix in (False, True):
        rules = filter_rules(allow_unix)
        for family in (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK):
            assert _socketpair_refusal(rules, family, SOCK_STREAM) is None
        for family in (0, 30, 40, 17, 0x1_0000001E, 0xFFFFFFFF):   # 30: AF_TIPC, which makes pairs
            assert _socketpair_refusal(rules, family, SOCK_STREAM) == errno.EAFNOSUPPORT, family
    # --allow-unix-sockets lifts the type rule: a datagram pair is then allowed.
    assert _socketpair_refusal(filter_rules(True), AF_UNIX, SOCK_DGRAM) is None


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

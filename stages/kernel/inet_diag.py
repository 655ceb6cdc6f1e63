"""Is there a TCP listener on a port that loopback reaches? (sock_diag, inet)

NETLINK_SOCK_DIAG dumps only the sockets of the network namespace the asking
netlink socket was made in: asked inside the sandbox, it says whether the
sandbox has a listener; asked by vpnw outside, whether the machine has one.
A listener counts when a connection to 127.0.0.1 or ::1 on that port would
reach it: bound to a loopback address or to any address. `dump_request` and
`parse_listeners` are sans-I/O (the walk over the dump is sock_diag.py's);
`loopback_listener` is the shell.

Layouts: include/uapi/linux/inet_diag.h, sock_diag.h, netlink.h.
"""
from __future__ import annotations

import ipaddress
import socket
import struct

from stages.kernel.sock_diag import (TCP_LISTEN, DiagError, dump_message, open_diag,  # noqa: F401
                                     read_dump, sock_diag_messages)

# struct inet_diag_req_v2 {u8 family, protocol, ext, pad; u32 states; struct inet_diag_sockid id}
# struct inet_diag_sockid {be16 sport, dport; be32 src[4], dst[4]; u32 if; u32 cookie[2]}
_REQ = struct.Struct("=BBBBI48x")
# struct inet_diag_msg {u8 family, state, timer, retrans; inet_diag_sockid id; u32 expires,
#                       rqueue, wqueue, uid, inode}
_MSG = struct.Struct("=BBBB2s2x16s")      # family, state, timer, retrans, sport (big-endian), src
_MSG_SIZE = 72


def dump_request(family: int, seq: int) -> bytes:
    return dump_message(_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN), seq)


def reaches_from_loopback(family: int, raw: bytes) -> bool:
    """A listener bound to this address takes connections to 127.0.0.1 or ::1."""
    if family == socket.AF_INET:
        return ipaddress.IPv4Address(raw[:4]) in _V4
    address = ipaddress.IPv6Address(raw[:16])
    return address in _V6 or address.ipv4_mapped in _V4


_V4 = (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv4Address("0.0.0.0"))
_V6 = (ipaddress.IPv6Address("::1"), ipaddress.IPv6Address("::"))


def parse_listeners(data: bytes) -> tuple[set[int], bool]:
    """One read's worth of the dump -> (the ports of listeners loopback
    reaches, whether the dump is over). DiagError on anything malformed."""
    ports: set[int] = set()
    for body in sock_diag_messages(data, _MSG_SIZE):
        if body is None:
            return ports, True
        family, state, _timer, _retrans, sport, src = _MSG.unpack_from(body)
        if state == TCP_LISTEN and family in (socket.AF_INET, socket.AF_INET6) \
                and reaches_from_loopback(family, src):
            ports.add(int.from_bytes(sport, "big"))
    return ports, False


def loopback_listener(port: int) -> bool:
    """Does this network namespace have a TCP listener that a connection to
    127.0.0.1:port or [::1]:port reaches? Raises OSError / DiagError."""
    with open_diag() as diag:
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            if port in read_dump(diag, dump_request(family, seq), parse_listeners):
                return True
    return False

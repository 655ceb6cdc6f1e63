"""Just enough rtnetlink to check the seal: dump links and routes, parse them.

pyroute2 would do this, but importing it costs 300-400 ms (its package
__init__ pulls in everything), which is most of vpnw's whole budget. The two
dumps we need are small and fixed, so we speak them directly: the parsers are
pure (bytes in, records out) and raise NetlinkError on anything malformed.
"""
from __future__ import annotations

import fcntl
import socket
import struct

from stages.startup.records import NamedTuple  # typing's, without importing typing

NETLINK_ROUTE = 0
RTM_GETLINK = 18
RTM_NEWLINK = 16
RTM_GETROUTE = 26
RTM_NEWROUTE = 24
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_DUMP = 0x300
IFLA_IFNAME = 3
RTA_DST = 1
RTA_OIF = 4
RTA_TABLE = 15
RTN_UNICAST, RTN_LOCAL, RTN_BROADCAST, RTN_MULTICAST = 1, 2, 3, 5
RT_TABLE_LOCAL = 255
RTPROT_BOOT = 3
RT_SCOPE_HOST = 254

_NLMSGHDR = struct.Struct("=IHHII")
_IFINFOMSG = struct.Struct("=BxHiII")
_RTMSG = struct.Struct("=BBBBBBBBI")
_RTATTR = struct.Struct("=HH")


class NetlinkError(Exception):
    pass


class Interface(NamedTuple):
    index: int
    name: str
    flags: int


class Route(NamedTuple):
    family: int
    dst: bytes | None    # raw address; None = default route (no RTA_DST)
    dst_len: int
    table: int
    type: int
    oif: int | None


def _align(n: int) -> int:
    return (n + 3) & ~3


def dump_request(msg_type: int, seq: int) -> bytes:
    if msg_type == RTM_GETLINK:
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    elif msg_type == RTM_GETROUTE:
        body = _RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0)
    else:
        raise ValueError(msg_type)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type,
                          NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def _attrs(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    off = 0
    while off + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, off)
        if length < _RTATTR.size or off + length > len(data):
            raise NetlinkError("bad attribute length")
        out[kind & 0x3FFF] = data[off + _RTATTR.size: off + length]
        off += _align(length)
    return out


def split_messages(data: bytes) -> tuple[list[tuple[int, bytes]], bool]:
    """One recv() worth of netlink -> ([(type, payload)], done?)."""
    msgs, off, done = [], 0, False
    while off + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, off)
        if length < _NLMSGHDR.size or off + length > len(data):
            raise NetlinkError("bad message length")
        payload = data[off + _NLMSGHDR.size: off + length]
        if kind == NLMSG_DONE:
            done = True
        elif kind == NLMSG_ERROR:
            code = struct.unpack_from("=i", payload)[0] if len(payload) >= 4 else -1
            if code:
                raise NetlinkError(f"netlink error {code}")
        else:
            msgs.append((kind, payload))
        off += _align(length)
    return msgs, done


def parse_link(payload: bytes) -> Interface:
    if len(payload) < _IFINFOMSG.size:
        raise NetlinkError("short ifinfomsg")
    _family, _type, index, flags, _change = _IFINFOMSG.unpack_from(payload)
    attrs = _attrs(payload[_IFINFOMSG.size:])
    name = attrs.get(IFLA_IFNAME, b"").split(b"\0", 1)[0].decode("utf-8", "replace")
    return Interface(index, name, flags)


def parse_route(payload: bytes) -> Route:
    if len(payload) < _RTMSG.size:
        raise NetlinkError("short rtmsg")
    family, dst_len, _src_len, _tos, table, _proto, _scope, rtype, _flags = _RTMSG.unpack_from(payload)
    attrs = _attrs(payload[_RTMSG.size:])
    dst = attrs.get(RTA_DST)
    if RTA_TABLE in attrs and len(attrs[RTA_TABLE]) == 4:
        table = struct.unpack("=I", attrs[RTA_TABLE])[0]
    oif = struct.unpack("=i", attrs[RTA_OIF])[0] if len(attrs.get(RTA_OIF, b"")) == 4 else None
    return Route(family, dst, dst_len, table, rtype, oif)


def seal_problems(links: list[Interface], routes: list[Route], capture: bool = False) -> list[str]:
    """What is wrong with this namespace for a sandbox; [] when it holds only lo.

    Allowed: exactly one link, `lo`; every route leaves through lo and points at
    loopback space (127.0.0.0/8, ::1) or is lo's multicast route. Anything else,
    including a route with no output interface (blackhole, multipath), is a
    problem: we would rather refuse than reason about it. With `capture`
    (docs/architecture.md "Capture"), exactly one more route per family is
    required and allowed: `local default dev lo` in the local table.
    """
    problems = []
    names = sorted(link.name for link in links)
    if names != ["lo"]:
        problems.append(f"expected exactly one interface, lo; found {', '.join(names) or 'none'}")
    lo_index = next((link.index for link in links if link.name == "lo"), None)
    captured = set()
    for r in routes:
        where = f"{_show(r)} (table {r.table})"
        if r.oif is None or r.oif != lo_index:
            problems.append(f"route {where} does not go through lo")
        elif capture and is_capture_route(r) and r.family not in captured:
            captured.add(r.family)
        elif r.dst is None:
            problems.append(f"default route {where}")
        elif not _is_loopback_route(r):
            problems.append(f"route {where} is not a loopback route")
    if capture:
        for family, name in ((socket.AF_INET, "IPv4"), (socket.AF_INET6, "IPv6")):
            if family not in captured:
                problems.append(f"the {name} local default route capture needs is missing")
    return problems


def is_capture_route(r: Route) -> bool:
    """`local default dev lo` (table local): every address is this namespace's own."""
    return (r.dst is None and r.dst_len == 0 and r.type == RTN_LOCAL
            and r.table == RT_TABLE_LOCAL and r.family in (socket.AF_INET, socket.AF_INET6))


_IPV6_LOOPBACK = bytes(15) + b"\1"


def _is_loopback_route(r: Route) -> bool:
    if r.family == socket.AF_INET:
        return len(r.dst) == 4 and r.dst[0] == 127 and r.dst_len >= 8
    if r.family == socket.AF_INET6 and len(r.dst) == 16:
        return ((r.dst == _IPV6_LOOPBACK and r.dst_len == 128)
                or (r.type == RTN_MULTICAST and r.dst[0] == 0xFF and r.dst_len >= 8))
    return False


def _show(r: Route) -> str:
    if r.dst is None:
        return f"default/{r.dst_len}"
    try:
        return f"{socket.inet_ntop(r.family, r.dst)}/{r.dst_len}"
    except (ValueError, OSError):
        return f"{r.dst.hex()}/{r.dst_len} (family {r.family})"


def _dump(sock: socket.socket, msg_type: int, seq: int) -> list[bytes]:
    sock.send(dump_request(msg_type, seq))
    payloads = []
    while True:
        msgs, done = split_messages(sock.recv(65536))
        payloads += [p for kind, p in msgs if kind in (RTM_NEWLINK, RTM_NEWROUTE)]
        if done:
            return payloads


def read_links_and_routes() -> tuple[list[Interface], list[Route]]:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        links = [parse_link(p) for p in _dump(sock, RTM_GETLINK, 1)]
        routes = [parse_route(p) for p in _dump(sock, RTM_GETROUTE, 2)]
    return links, routes


def bring_up(name: str = "lo") -> None:
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", name.encode(), 0)
        flags = struct.unpack_from("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", name.encode(), flags | IFF_UP))


def local_default_request(family: int, lo_index: int, seq: int) -> bytes:
    """RTM_NEWROUTE for `ip route add local default dev lo` (table local)."""
    body = _RTMSG.pack(family, 0, 0, 0, RT_TABLE_LOCAL, RTPROT_BOOT, RT_SCOPE_HOST, RTN_LOCAL, 0)
    body += _RTATTR.pack(8, RTA_OIF) + struct.pack("=i", lo_index)
    body += _RTATTR.pack(8, RTA_TABLE) + struct.pack("=I", RT_TABLE_LOCAL)
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_NEWROUTE, flags, seq, 0) + body


def add_local_default_routes(lo_index: int) -> None:
    """Capture's routes, IPv4 and IPv6 (a kernel without IPv6 refuses the
    second: NetlinkError). Raises NetlinkError with the kernel's error."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            sock.send(local_default_request(family, lo_index, seq))
            split_messages(sock.recv(65536))     # the ack; an error raises

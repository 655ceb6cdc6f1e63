"""The addresses of this machine's own interfaces (for deny_private).

Computed once when the broker starts: IPv4 from ioctl(SIOCGIFCONF), IPv6 from
/proc/net/if_inet6. Importing pyroute2 for this would cost ~300 ms.
"""
from __future__ import annotations

import array
import fcntl
import ipaddress
import socket
import struct

SIOCGIFCONF = 0x8912
_IFREQ_SIZE = 40  # struct ifreq on 64-bit Linux


def ipv4_addresses() -> set[ipaddress.IPv4Address]:
    found = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        size = 64 * _IFREQ_SIZE
        while True:
            buf = array.array("B", bytes(size))
            addr, _ = buf.buffer_info()
            ifconf = struct.pack("iL", size, addr)
            used, _ = struct.unpack("iL", fcntl.ioctl(sock.fileno(), SIOCGIFCONF, ifconf))
            if used < size:
                break
            size *= 2
        raw = buf.tobytes()
        for off in range(0, used, _IFREQ_SIZE):
            # ifr_name[16], then struct sockaddr_in: family(2) port(2) addr(4)
            family = struct.unpack_from("H", raw, off + 16)[0]
            if family == socket.AF_INET:
                found.add(ipaddress.IPv4Address(raw[off + 20:off + 24]))
    return found


def ipv6_addresses(path: str = "/proc/net/if_inet6") -> set[ipaddress.IPv6Address]:
    found = set()
    try:
        with open(path) as table:
            for line in table:
                fields = line.split()
                if fields and len(fields[0]) == 32:
                    found.add(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
    except OSError:
        pass  # no IPv6 in this kernel
    return found


def local_addresses() -> frozenset:
    try:
        v4 = ipv4_addresses()
    except OSError:
        v4 = set()
    return frozenset(v4 | ipv6_addresses())

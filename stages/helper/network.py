"""The sandbox's network, as the seal makes and checks it: its loopback up
and nothing else (the network check), capture's routes when asked, the
doors the broker accepts on, and the kernel's no-route counters (each a way
out the program tried other than the doors)."""
from __future__ import annotations

import os
import socket

from stages.helper import netlink
from stages.helper.processes import DOCTOR_HINT, SealError
from stages.wire import handoff


def check_network(capture: bool = False) -> None:
    """lo up, then the seal check: no other link, no route but lo's (capture's
    own, when asked); SealError when either fails."""
    try:
        netlink.bring_up("lo")
    except (OSError, netlink.NetlinkError) as e:
        raise SealError(f"cannot bring up or inspect the sandbox's loopback: {e}; {DOCTOR_HINT}")
    _loopback_congestion_control()
    if capture:
        _install_capture()
    try:
        links, routes = netlink.read_links_and_routes()
    except (OSError, netlink.NetlinkError) as e:
        raise SealError(f"cannot bring up or inspect the sandbox's loopback: {e}; {DOCTOR_HINT}")
    problems = netlink.seal_problems(links, routes, capture=capture)
    if problems:
        raise SealError("the sandbox's network is not sealed: " + "; ".join(problems))


# The sandbox's every TCP connection is on its own loopback (the program to
# a door): nothing is ever lost there, so congestion control has nothing to
# do, and a pacing one makes every tunnel slow. BBR, many machines' default
# and inherited by each new namespace, paces the broker's splice into the
# program's socket: curl's 1 GiB download through either door moved
# 0.68-0.70x of direct with it and 0.87-0.90x with reno, in the same bench
# rounds (docs/architecture.md, "Tunnel throughput: the bound"). reno is
# built into every kernel and is one a namespace's root may always make its
# default.
LOOPBACK_CONGESTION_CONTROL = b"reno"


def _loopback_congestion_control() -> None:
    """The sandbox's TCP default, set before the doors listen, so the
    doors' accepted sockets and the program's own all take it. /proc/sys/net
    is the writer's network namespace's: this one's. Where it cannot be
    written (a container with /proc/sys read-only) the run goes on with the
    machine's default: only speed is at stake."""
    try:
        fd = os.open("/proc/sys/net/ipv4/tcp_congestion_control", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, LOOPBACK_CONGESTION_CONTROL)
    except OSError:
        pass
    finally:
        os.close(fd)


def _install_capture() -> None:
    """The routes and nftables table capture needs (stages/helper/capture.py),
    checked before anything listens; a run that asked for capture never goes
    on without it."""
    # Only a run with --capture: capture loads libnftables (through _ctypes).
    from stages.helper import capture
    try:
        capture.install(handoff.CAPTURE_DOORS["capture"], handoff.DNS_PORT)
        capture.bind_resolv_conf()
    except capture.CaptureError as e:
        raise SealError(f"capture cannot work here: {e}; {DOCTOR_HINT}")
    except OSError as e:
        raise SealError(f"capture cannot work here: cannot point /etc/resolv.conf at the DNS "
                        f"door: {e}; {DOCTOR_HINT}")


def open_doors(opened: list[tuple[str, int]]) -> list[tuple[str, socket.socket]]:
    doors = []
    try:
        for door, port in opened:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", port))
            s.listen(4096)    # the kernel caps it at net.core.somaxconn
            s.setblocking(False)
            doors.append((door, s))
    except OSError as e:
        raise SealError(f"cannot listen on the doors: {e.strerror}")
    # [::1] too, for programs that resolve "localhost" to ::1 first. A kernel
    # without IPv6 simply has no ::1 to reach, so that is not an error.
    for door, port in opened:
        try:
            s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(("::1", port))
            s.listen(4096)    # the kernel caps it at net.core.somaxconn
            s.setblocking(False)
            doors.append((door, s))
        except OSError:
            break
    return doors


def open_dns_datagrams() -> list[socket.socket]:
    """The DNS door's UDP side, 127.0.0.1:53 and [::1]:53 (handed to the broker)."""
    socks = []
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((address, handoff.DNS_PORT))
        except OSError as e:
            s.close()
            if family == socket.AF_INET6:
                break
            raise SealError(f"cannot listen on the DNS door (UDP {address}:53): {e.strerror}")
        s.setblocking(False)
        socks.append(s)
    return socks


def open_counters() -> list[int]:
    """The sandbox network's counters (the helper is in that namespace)."""
    fds = []
    for name in ("/proc/self/net/snmp", "/proc/self/net/snmp6"):
        try:
            fds.append(os.open(name, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            fds.append(-1)
    return fds


def no_route_count(counters: list[int]) -> int:
    """Sends and connects the sandbox's network refused for want of a route:
    each is the program trying a way out other than the doors. The kernel
    counts them; 0 if they cannot be read."""
    texts = []
    for fd in counters:
        try:
            texts.append(os.pread(fd, 65536, 0).decode("ascii", "replace") if fd >= 0 else "")
        except OSError:
            texts.append("")
    return no_routes(*texts)


def no_routes(snmp: str, snmp6: str) -> int:
    """Ip: OutNoRoutes (a header line, then a values line) plus Ip6OutNoRoutes."""
    total = 0
    ip = [line.split() for line in snmp.splitlines() if line.startswith("Ip: ")]
    if len(ip) >= 2 and "OutNoRoutes" in ip[0] and len(ip[1]) == len(ip[0]):
        total += int(ip[1][ip[0].index("OutNoRoutes")])
    for line in snmp6.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "Ip6OutNoRoutes" and words[1].isdigit():
            total += int(words[1])
    return total


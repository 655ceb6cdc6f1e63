"""What the supervisor reports, before the program hears its answer: a
refused connect or one to a policy-named socket (Report), and a refused
connect to a loopback port nothing listens on (RefusedLoopbackConnect); and
how the record shows a destination."""
from __future__ import annotations

import socket

from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.helper.supervisor.judge import UnixDestination


def shown(destination: UnixDestination) -> str:
    """The destination as the record shows it: a path, or @name (abstract)."""
    if destination.kind == "abstract":
        return "@" + destination.name[1:].decode("utf-8", "backslashreplace")
    return destination.name.decode("utf-8", "backslashreplace")


def shown_inet(raw: bytes) -> str:
    """An IP sockaddr as the record shows a refused one: ADDRESS:PORT, or
    the family's number for any other."""
    import ipaddress    # a refused IP connect's alone needs it: kept off the helper's start
    family = int.from_bytes(raw[:2], "little") if len(raw) >= 2 else -1
    if family == socket.AF_INET and len(raw) >= 8:
        return f"{ipaddress.IPv4Address(raw[4:8])}:{int.from_bytes(raw[2:4], 'big')}"
    if family == socket.AF_INET6 and len(raw) >= 24:
        return f"[{ipaddress.IPv6Address(raw[8:24])}]:{int.from_bytes(raw[2:4], 'big')}"
    return f"(address family {family})"


class Report(NamedTuple):
    """One line of the record: a refused connect, or one to a policy-named socket."""
    allowed: bool
    path: str
    process: int          # the PID inside the sandbox (0 if it is gone)
    program: str          # its command name
    reason: str           # why refused / the policy's entry


class RefusedLoopbackConnect(NamedTuple):
    """A TCP connect to a port of the sandbox's own loopback that nothing
    there listens on, which the kernel refuses: the evidence for the closing
    hint that names a `localhost:PORT` rule (stages/recorder/hints.py)."""
    port: int
    process: int
    program: str


"""Where `--syslog [TARGET]` sends: the target's syntax and its socket.

    /dev/log, /run/my.sock     a Unix datagram socket (the local format)
    udp://HOST:PORT            one RFC 5424 message per datagram (RFC 5426)
    tcp://HOST:PORT            RFC 5424 messages, octet-counted (RFC 6587)

IPv6 literals go in brackets (`udp://[::1]:514`). A HOST name is looked up
once, when the run starts, outside the sandbox. Every socket is non-blocking:
the recorder hands it to a bounded feeder and never waits on it.
"""
from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass

DEFAULT_TARGET = "/dev/log"


class TargetError(ValueError):
    """A --syslog TARGET that is not one of the forms above."""


@dataclass(frozen=True)
class SyslogTarget:
    kind: str            # unix | udp | tcp
    path: str | None = None
    host: str | None = None
    port: int | None = None

    @property
    def datagrams(self) -> bool:
        return self.kind in ("unix", "udp")

    @property
    def local_format(self) -> bool:
        # /dev/log speaks syslog(3)'s format; the daemon there adds the host name.
        return self.kind == "unix"

    def __str__(self) -> str:
        if self.kind == "unix":
            return self.path
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.kind}://{host}:{self.port}"


def parse_target(text: str | None) -> SyslogTarget:
    if text is None or text == "":
        text = DEFAULT_TARGET
    if text.startswith("/"):
        if "\0" in text:
            raise TargetError("a socket path cannot hold a NUL byte")
        return SyslogTarget("unix", path=text)
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("udp", "tcp"):
        raise TargetError(f"{text!r} is not a syslog target; use /dev/log (or another "
                          "socket path), udp://HOST:PORT or tcp://HOST:PORT")
    rest = rest.rstrip("/")
    if rest.startswith("["):
        host, bracket, port_text = rest[1:].partition("]")
        if not bracket or not port_text.startswith(":"):
            raise TargetError(f"{text!r}: an IPv6 address goes in brackets, then :PORT")
        port_text = port_text[1:]
    else:
        host, colon, port_text = rest.rpartition(":")
        if not colon:
            raise TargetError(f"{text!r}: give the port, as in {scheme}://{rest}:514")
    if not host or ":" in host and not rest.startswith("["):
        raise TargetError(f"{text!r}: give a host and a port, as in {scheme}://127.0.0.1:514")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise TargetError(f"{text!r}: the port must be a number from 1 to 65535")
    return SyslogTarget(scheme, host=host, port=int(port_text))


def open_socket(target: SyslogTarget) -> socket.socket:
    """A non-blocking socket connected (or, for TCP, connecting) to `target`.
    OSError if the target cannot be reached at all (no such socket, no such
    host): the caller says so and the run goes on without the copy."""
    if target.kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(target.path)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        return sock
    kind = socket.SOCK_DGRAM if target.kind == "udp" else socket.SOCK_STREAM
    infos = socket.getaddrinfo(target.host, target.port, type=kind)
    family, socktype, proto, _, address = infos[0]
    sock = socket.socket(family, socktype | socket.SOCK_CLOEXEC, proto)
    sock.setblocking(False)
    try:
        if target.kind == "udp":
            sock.connect(address)
        else:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            err = sock.connect_ex(address)
            if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
                raise OSError(err, os.strerror(err))
    except OSError:
        sock.close()
        raise
    return sock

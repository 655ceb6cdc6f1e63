"""ssh's ProxyCommand inside vpnw: stdin/stdout <-> vpnw's SOCKS5 door.

    ssh -o 'ProxyCommand=python3 -I -m stages.inside.ssh_proxy %h %p' git@host

vpnw sets GIT_SSH_COMMAND to that (stages/config/client_env.py), so git over ssh
goes through the door with no configuration. The name travels unresolved
(SOCKS5 address type "domain", socks5h semantics): the sandbox has no
resolver, the broker decides `host:22` with the policy like any connection
and records it, and ssh checks the host key against the name the user typed.

It runs inside the sandbox as the program's child (under its seccomp filter),
once per ssh connection, so it imports only the sans-I/O SOCKS5 client.
Exit codes: 0 after both directions closed; 1 when the door could not be
reached or refused the connection (the message says why, on stderr, which
ssh shows); 2 for a bad command line.
"""
from __future__ import annotations

import os
import socket
import sys
import threading

from stages.protocols.proxy_clients import (
    Authenticated, AuthRefused, Connected, ConnectFailed, ExitProtocolError, Socks5Client,
)

DOOR = ("127.0.0.1", 1080)
CHUNK = 65536
USAGE = "usage: python3 -m stages.inside.ssh_proxy HOST PORT   (as ssh's ProxyCommand: %h %p)"
# What the door's SOCKS5 reply codes mean when the other side is vpnw's broker.
DOOR_REPLIES = {
    2: "denied by vpnw's policy (vpnw's record says which rule)",
    4: "vpnw could not reach it (host unreachable or no such name)",
    5: "the destination refused the connection",
}


class RelayError(Exception):
    """The tunnel could not be opened; the message is for the person."""


def open_tunnel(host: str, port: int, door: tuple[str, int] = DOOR) -> socket.socket:
    """Connect to the door and ask it for host:port; return the tunnel."""
    try:
        sock = socket.create_connection(door)
    except OSError as exc:
        raise RelayError(f"cannot reach vpnw's SOCKS5 door at {door[0]}:{door[1]} "
                         f"({exc.strerror or exc}); is this running inside vpnw?") from None
    client = Socks5Client()
    try:
        sock.sendall(client.start())
        while True:
            data = sock.recv(client.bytes_needed)
            if not data:
                raise RelayError(f"vpnw's SOCKS5 door closed the connection to {host}:{port}")
            for event in client.receive(data):
                if isinstance(event, Authenticated):
                    sock.sendall(client.connect(host, port))
                elif isinstance(event, Connected):
                    return sock
                elif isinstance(event, ConnectFailed):
                    why = DOOR_REPLIES.get(event.code, event.message)
                    raise RelayError(f"vpnw did not open {host}:{port}: {why}")
                elif isinstance(event, AuthRefused):
                    raise RelayError(f"vpnw's SOCKS5 door refused us: {event.message}")
    except ExitProtocolError as exc:
        sock.close()
        raise RelayError(f"the SOCKS5 door at {door[0]}:{door[1]} answered oddly: {exc}") from None
    except OSError as exc:
        sock.close()
        raise RelayError(f"lost vpnw's SOCKS5 door while asking for {host}:{port}: "
                         f"{exc.strerror or exc}") from None
    except BaseException:
        sock.close()
        raise


def _copy_up(stdin_fd: int, sock: socket.socket) -> None:
    try:
        while data := os.read(stdin_fd, CHUNK):
            sock.sendall(data)
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def relay(sock: socket.socket, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
    """Copy stdin -> tunnel and tunnel -> stdout until both directions end.
    stdin's end half-closes the tunnel; the tunnel's end closes stdout. One
    thread a direction: each may block on its write without stalling the other."""
    up = threading.Thread(target=_copy_up, args=(stdin_fd, sock), daemon=True)
    up.start()
    try:
        while data := sock.recv(CHUNK):
            view = memoryview(data)
            while view:
                view = view[os.write(stdout_fd, view):]
    except ConnectionResetError:
        pass
    finally:
        os.close(stdout_fd)
    up.join()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit() or not 0 < int(args[1]) < 65536:
        sys.stderr.write(f"vpnw ssh relay: {USAGE}\n")
        return 2
    host, port = args[0], int(args[1])
    try:
        sock = open_tunnel(host, port)
    except (RelayError, ValueError) as exc:
        sys.stderr.write(f"vpnw ssh relay: {exc}\n")
        return 1
    try:
        relay(sock)
    except BrokenPipeError:
        pass  # ssh went away: nothing left to say
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

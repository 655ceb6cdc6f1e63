"""The WireGuard path's dialer: the tunnel lives in a namespace of vpnw's own
(stages/broker/wireguard/path_process.py, started here by `check()`); every dial uses a socket made
in that namespace and handed over by fd, so the connection can only leave
through the tunnel, and the machine's routes never change.

Fail closed: `check()` raises PathDownError (exit 123) unless wireguard-go
completed a handshake in time; once the path process or wireguard-go is
gone, each new dial fails with path-down, never a direct connection.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys

import stages
from stages.broker.dial import DialError, PathDownError, dial_direct
from stages.broker.wireguard import control
from stages.protocols import dns as dns_wire

START_TIMEOUT = 20.0    # the path process's own handshake bound is shorter


# The path process runs isolated (-I): PYTHONPATH, PYTHONSTARTUP, the user's
# site-packages and the working directory cannot put code of anyone else's
# into a process that holds the tunnel's keys. Its imports come from where
# this vpnw's own do (the directory that holds `stages`).
_STAGES_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(stages.__file__)))
_PATH_PROCESS_START = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
                       "from stages.broker.wireguard.path_process import main; sys.exit(main(sys.argv))")


class WireGuardDialer:
    kind = "wireguard"
    resolves_at_exit = False

    def __init__(self, path):
        self.path = path
        self.ctl: socket.socket | None = None
        self.process: subprocess.Popen | None = None
        self.lock = asyncio.Lock()
        self.down: str | None = None
        self.spare: dict[int, list[socket.socket]] = {}
        # With DNS = in the .conf, names are looked up by the office's server,
        # through the tunnel (connector.py asks `resolve` when it is set).
        self.resolve = self._resolve_in_tunnel if path.wireguard.dns else None
        self.own_addresses = frozenset(a.ip for a in path.wireguard.addresses)

    async def check(self) -> None:
        wg = self.path.wireguard
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # The tunnel's keys go over the socket, never in argv or the environment.
            ours.send(json.dumps(control.tunnel_message(wg, wg.private_key)).encode())
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-c", _PATH_PROCESS_START, _STAGES_ROOT, str(os.getpid()),
                 str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True)
        except OSError as exc:
            ours.close()
            raise PathDownError(f"{self.path.exit_text()}: cannot start the path process ({exc})") from None
        finally:
            theirs.close()
        ours.setblocking(False)
        self.ctl = ours
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(START_TIMEOUT):
                answer = control.decode_start(await loop.sock_recv(ours, 4096))
        except asyncio.TimeoutError:
            answer = control.Down("the tunnel did not come up in time")
        except (OSError, control.ControlError):
            answer = control.Down("the path process stopped before it opened the tunnel")
        if not isinstance(answer, control.Up):
            self.close()
            # Said after "the path 'NAME' is down: ": the endpoint once, never the name.
            endpoint = str(self.path.wireguard.endpoint)
            raise PathDownError(answer.reason if endpoint in answer.reason
                                else f"{self.path.exit_text()}: {answer.reason}")

    async def _socket(self, family: int, kind: str = "t") -> socket.socket:
        """A socket made in the path namespace (DialError path-down when gone).
        TCP sockets come in batches (one round trip to the path process per
        SOCKET_BATCH dials), kept unconnected until a dial takes one."""
        if self.ctl is None or self.down:
            raise DialError("path-down", self.down or "the WireGuard path is not open")
        loop = asyncio.get_running_loop()
        stream = kind == "t"
        if stream:
            spare = self.spare.setdefault(family, [])
            if spare:
                return spare.pop()
        async with self.lock:
            if stream and self.spare[family]:
                return self.spare[family].pop()       # another dial fetched a batch meanwhile
            try:
                await loop.sock_sendall(self.ctl, control.encode_request(
                    control.SocketRequest(family, stream=stream, batch=stream)))
                got = await _reply(loop, self.ctl)
            except (OSError, EOFError, control.ControlError) as exc:
                self.down = (f"the WireGuard tunnel to {self.path.wireguard.endpoint} is gone "
                             f"(its process stopped: {exc or 'closed'})")
                raise DialError("path-down", self.down) from None
        if isinstance(got, control.Down):
            self.down = f"the WireGuard tunnel to {self.path.wireguard.endpoint} is gone ({got.reason})"
            raise DialError("path-down", self.down)
        if not isinstance(got, control.Sockets):
            reason = got.reason if isinstance(got, control.ControlRefused) else "an answer to another question"
            raise DialError("internal", f"the path namespace made no socket: {reason}")
        first, *rest = (socket.socket(fileno=fd) for fd in got.fds)
        if stream:
            self.spare[family][:0] = rest
        return first

    async def dial(self, host: str, port: int, addresses: tuple) -> tuple[socket.socket, str]:
        try:
            return await dial_direct(addresses, port, make_socket=self._socket)
        except DialError as exc:
            # Unreachable or silent: the destination's fault, or the tunnel's?
            if exc.error in ("unreachable", "timeout"):
                await self._ask_health()
            raise

    async def _ask_health(self) -> None:
        """Raise DialError path-down when the path process says the tunnel is down."""
        loop = asyncio.get_running_loop()
        async with self.lock:
            try:
                await loop.sock_sendall(self.ctl, control.encode_request(control.HealthQuestion()))
                got = await _reply(loop, self.ctl)
            except (OSError, EOFError, control.ControlError):
                got = control.Down("its process stopped")
        if isinstance(got, control.Down):
            self.down = f"the WireGuard tunnel to {self.path.wireguard.endpoint} is gone ({got.reason})"
            raise DialError("path-down", self.down)

    async def _resolve_in_tunnel(self, host: str) -> tuple[tuple, str]:
        """-> (addresses, the server that answered); DialError("dns") when no
        server answered, path-down when the tunnel is gone."""
        wg = self.path.wireguard
        want_v6 = any(a.version == 6 for a in wg.addresses)
        loop = asyncio.get_running_loop()
        problem = "no DNS server answered"
        for server in wg.dns:
            family = socket.AF_INET6 if server.version == 6 else socket.AF_INET
            sock = await self._socket(family, "u")
            with sock:
                sock.setblocking(False)
                try:
                    sock.connect((str(server), 53))
                    found = []
                    for qtype in (dns_wire.A, dns_wire.AAAA) if want_v6 else (dns_wire.A,):
                        found += await _ask(loop, sock, host, qtype)
                    return tuple(found), str(server)
                except (OSError, asyncio.TimeoutError, dns_wire.DnsAnswerError) as exc:
                    problem = f"{server}: " + ("timed out" if isinstance(exc, asyncio.TimeoutError)
                                               else str(exc))
        await self._ask_health()
        raise DialError("dns", f"{host}: the name was not resolved through the tunnel ({problem})")

    def close(self) -> None:
        for spare in self.spare.values():
            for sock in spare:
                sock.close()
        if self.ctl is not None:
            self.ctl.close()
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


async def _reply(loop, ctl: socket.socket):
    """The path process's next reply (control.py), its sockets attached."""
    future = loop.create_future()

    def readable():
        if future.done():
            return
        try:
            message, fds, _, _ = socket.recv_fds(ctl, 4096, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            future.set_exception(exc)
            return
        future.set_result((message, fds))

    loop.add_reader(ctl.fileno(), readable)
    try:
        message, fds = await future
    finally:
        loop.remove_reader(ctl.fileno())
    if not message and not fds:
        raise EOFError("closed")
    return control.decode_reply(message, fds)


DNS_TRY_TIMEOUT = 2.0


async def _ask(loop, sock: socket.socket, host: str, qtype: int) -> list:
    """One question to the tunnel's DNS server, asked up to twice."""
    query_id = int.from_bytes(os.urandom(2), "big")
    query = dns_wire.build_query(query_id, host, qtype)
    for attempt in range(2):
        await loop.sock_sendall(sock, query)
        try:
            async with asyncio.timeout(DNS_TRY_TIMEOUT):
                while True:
                    data = await loop.sock_recv(sock, 4096)
                    try:
                        return dns_wire.parse_answer(data, query_id, qtype)
                    except dns_wire.DnsAnswerError as exc:
                        if "does not match" not in str(exc):
                            raise
        except asyncio.TimeoutError:
            if attempt:
                raise
    return []

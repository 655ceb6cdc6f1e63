"""The broker's loop: accept handed-over connections, speak each door's
handshake, decide, dial, relay, and record every step.

One asyncio loop (epoll) serves every connection: a task per connection for
the handshake and the dial, then the splice relay (readiness callbacks, no
task work per byte). Name lookups run in the loop's bounded thread pool.

Plain-HTTP forwarding (absolute-URI requests) keeps connections alive: the
request head is parsed on the client side, its body streamed by its own
framing, the origin's response framed by `ResponseParser`, and only then is
the next request head read. A request to the same host:port as the open
upstream connection reuses it (same host and port, same decision); any other
host:port is a new connection in the record, decided and dialled anew, so a
second request never rides the first one's permission.
"""
from __future__ import annotations

import asyncio
import ipaddress
import os
import resource
import signal
import socket
import threading
import time
from dataclasses import dataclass

from . import http_proxy, socks5
from .limits import MAX_PENDING_HANDSHAKES
from .dial import DialError, PathDown, dialer_for
from .relay import Relay
from .. import status as st
from ..exits import ExitCode
from ..handoff import HandoffError, recv_conn
from ..record import Emitter

HANDSHAKE_TIMEOUT = 30.0    # the first request head must arrive within this (slowloris)
IDLE_TIMEOUT = 120.0        # between requests on a kept-alive client connection
DNS_TIMEOUT = 15.0
RECV_SIZE = 256 * 1024


@dataclass
class Denied:
    reason: str


@dataclass
class Failed:
    error: str
    reason: str


@dataclass
class Opened:
    conn: int
    sock: socket.socket
    address: str
    opened_at: float
    bytes_up: int = 0
    bytes_down: int = 0
    closed: bool = False


def _ms(since: float) -> int:
    return int(round((time.monotonic() - since) * 1000))


def _warn(message: str) -> None:
    try:
        os.write(2, f"vpnw broker: warning: {message}\n".encode("utf-8", "replace"))
    except OSError:
        pass


class Broker:
    def __init__(self, *, emitter: Emitter, status_fd: int, policy, path,
                 dry_run: bool = False, grace: float = 2.0,
                 local_addresses: frozenset = frozenset(), path_reported: bool = False):
        from . import decide as decide_module
        self.path_reported = path_reported  # main_from_fds already said the direct path is ok
        self.decide = decide_module
        self.emitter = emitter
        self.status_fd = status_fd
        self.policy = policy
        self.path = path
        self.dry_run = dry_run
        self.grace = grace
        self.local_addresses = local_addresses
        self.dialer = dialer_for(path)
        self.resolves_at_exit = self.dialer.resolves_at_exit
        self.last_conn = 0
        self.totals = {"connections": 0, "denied": 0, "would_deny": 0, "failed": 0}
        self.tasks: set[asyncio.Task] = set()
        self.relays: set[Relay] = set()
        self.stopping: asyncio.Event | None = None
        self.handshaking: set[socket.socket] = set()   # handed over, no request yet
        self.flush_scheduled = False
        emitter.hold()

    # record and status ------------------------------------------------------
    def emit(self, type_: str, conn: int | None = None, **fields) -> None:
        self.emitter.emit(type_, conn, **fields)
        if not self.flush_scheduled:
            # One write per loop turn, not per event: the recorder wakes less
            # often and the loop spends its time relaying.
            try:
                asyncio.get_running_loop().call_soon(self.flush_events)
                self.flush_scheduled = True
            except RuntimeError:  # no loop (yet or any more): write now
                self.emitter.flush()

    def flush_events(self) -> None:
        self.flush_scheduled = False
        self.emitter.flush()

    def status(self, message: st.Message) -> None:
        self.emitter.flush()  # the orchestrator acts on totals: every event goes first
        try:
            st.write(self.status_fd, message)
        except OSError:
            pass

    def report_totals(self) -> None:
        self.status(st.Totals(**self.totals))

    def new_conn(self) -> int:
        self.last_conn += 1
        self.totals["connections"] += 1
        return self.last_conn

    def fail(self, conn: int, stage: str, error: str, reason: str) -> Failed:
        self.totals["failed"] += 1
        self.emit("conn.fail", conn, stage=stage, error=error, reason=reason)
        return Failed(error, reason)

    def close_conn(self, opened: Opened) -> None:
        if opened.closed:
            return
        opened.closed = True
        try:
            opened.sock.close()
        except OSError:
            pass
        self.emit("conn.close", opened.conn, bytes_up=opened.bytes_up,
                  bytes_down=opened.bytes_down, ms=_ms(opened.opened_at))

    # the run ----------------------------------------------------------------
    async def check_path(self) -> bool:
        if self.path_reported:
            return True
        started = time.monotonic()
        name = getattr(self.path, "name", "direct")
        kind = self.dialer.kind
        try:
            await self.dialer.check()
        except PathDown as exc:
            ms = _ms(started)
            self.emit("path.check", path=name, type=kind, ok=False, ms=ms, error=str(exc))
            self.status(st.PathDown(path=name, error=str(exc)))
            return False
        ms = _ms(started)
        self.emit("path.check", path=name, type=kind, ok=True, ms=ms)
        self.status(st.PathOk(path=name, type=kind, ms=ms))
        return True

    async def run(self, handoff: socket.socket) -> int:
        loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        if threading.current_thread() is threading.main_thread():
            loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        # A SIGTERM during the path check (vpnw interrupted before the program
        # starts) must not wait out the check's timeout.
        checking = asyncio.ensure_future(self.check_path())
        stopped = asyncio.ensure_future(self.stopping.wait())
        await asyncio.wait({checking, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not checking.done():
            checking.cancel()
            await asyncio.wait({checking})
            self.report_totals()
            return ExitCode.PATH_DOWN
        if not checking.result():
            self.report_totals()
            return ExitCode.PATH_DOWN
        handoff.setblocking(False)
        loop.add_reader(handoff.fileno(), self._on_handoff, handoff)
        try:
            await self.stopping.wait()
        finally:
            loop.remove_reader(handoff.fileno())
        await self._wind_down()
        self.report_totals()
        return 0

    def _on_handoff(self, handoff: socket.socket) -> None:
        for _ in range(64):
            try:
                got = recv_conn(handoff)
            except (BlockingIOError, InterruptedError):
                return
            except HandoffError as exc:
                _warn(f"dropped a bad handoff message: {exc}")
                continue
            except OSError as exc:
                _warn(f"handoff socket failed: {exc}")
                self.stopping.set()
                return
            if got is None:
                self.stopping.set()
                return
            door, sock = got
            if len(self.handshaking) >= MAX_PENDING_HANDSHAKES:
                sock.close()
                self.fail(self.new_conn(), "handshake", "refused",
                          f"{MAX_PENDING_HANDSHAKES} connections are already waiting to send "
                          "their request; this one was closed at once")
                continue
            self.handshaking.add(sock)
            task = asyncio.get_running_loop().create_task(self._serve(door, sock))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _wind_down(self) -> None:
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=self.grace)
        for relay in list(self.relays):
            relay.abort()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(set(self.tasks))

    async def _serve(self, door: str, sock: socket.socket) -> None:
        sock.setblocking(False)
        try:
            if door == "socks":
                await self.serve_socks(sock)
            else:
                await self.serve_http(sock)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # one connection's bug must not end the run
            _warn(f"internal error on a {door} connection: {exc!r}")
        finally:
            self.handshaking.discard(sock)
            sock.close()

    # shared steps -------------------------------------------------------------
    async def connect(self, conn: int, door: str, kind: str, host: str, port: int):
        """conn.request -> decide (lookup if needed) -> dial. Returns Opened,
        Denied or Failed, having written every event on the way: a request
        always ends, even when the run stops in the middle of it."""
        self.emit("conn.request", conn, door=door, kind=kind, host=host, port=port)
        progress = {"stage": "resolve", "ended": False}
        try:
            outcome = await self._connect(conn, host, port, progress)
        except asyncio.CancelledError:
            if not progress["ended"]:
                self.fail(conn, progress["stage"], "internal", "vpnw stopped before the connection was made")
            raise
        except Exception as exc:
            if not progress["ended"]:
                return self.fail(conn, progress["stage"], "internal", f"vpnw failed: {exc!r}")
            raise
        return outcome

    async def _connect(self, conn: int, host: str, port: int, progress: dict):
        d = self.decide
        try:
            target = d.parse_target(host, port)
        except d.BadTarget as exc:
            reason = str(exc)
            self.totals["denied"] += 1
            progress["ended"] = True
            self.emit("policy.deny", conn, rule="target", reason=reason, enforced=True)
            return Denied(reason)
        addresses = None
        try:
            verdict = d.decide(target, self.policy, None, local_addresses=self.local_addresses,
                               resolves_at_exit=self.resolves_at_exit)
            if isinstance(verdict, d.LookUp):
                addresses = await self.resolve(conn, target.host, port)
                verdict = d.decide(target, self.policy, addresses, local_addresses=self.local_addresses,
                                   resolves_at_exit=self.resolves_at_exit)
                if isinstance(verdict, d.LookUp):
                    raise RuntimeError("decide asked for a second lookup")
        except DialError as exc:
            progress["ended"] = True
            return self.fail(conn, "resolve", exc.error, exc.reason)
        if verdict.allowed:
            self.emit("policy.allow", conn, rule=verdict.rule, reason=verdict.reason)
        else:
            self.emit("policy.deny", conn, rule=verdict.rule, reason=verdict.reason,
                      enforced=not self.dry_run)
            if not self.dry_run:
                self.totals["denied"] += 1
                progress["ended"] = True
                return Denied(verdict.reason)
            self.totals["would_deny"] += 1
        dial_addresses = tuple(verdict.addresses or ())
        if not dial_addresses and target.ip is not None:
            dial_addresses = (target.ip,)
        if not dial_addresses and not self.resolves_at_exit:
            # The policy did not need the addresses, but dialling does.
            try:
                dial_addresses = await self.resolve(conn, target.host, port)
            except DialError as exc:
                progress["ended"] = True
                return self.fail(conn, "resolve", exc.error, exc.reason)
        progress["stage"] = "dial"
        started = time.monotonic()
        try:
            sock, address = await self.dialer.dial(target.host, port, dial_addresses)
        except DialError as exc:
            progress["ended"] = True
            return self.fail(conn, "path" if exc.error == "path-down" else "dial", exc.error, exc.reason)
        progress["ended"] = True
        sock.setblocking(False)
        self.emit("conn.open", conn, address=address, port=port,
                  via=getattr(self.path, "name", "direct"), ms=_ms(started))
        return Opened(conn, sock, address, time.monotonic())

    async def resolve(self, conn: int, host: str, port: int) -> tuple:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            async with asyncio.timeout(DNS_TIMEOUT):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                               proto=socket.IPPROTO_TCP)
        except (OSError, asyncio.TimeoutError, UnicodeError) as exc:
            message = "timed out" if isinstance(exc, asyncio.TimeoutError) else (
                getattr(exc, "strerror", None) or str(exc))
            self.emit("dns.resolve", conn, host=host, addresses=[], ms=_ms(started), error=message)
            raise DialError("dns", f"{host}: the name was not resolved ({message})") from None
        found = []
        for family, _, _, _, sockaddr in infos:
            if family not in (socket.AF_INET, socket.AF_INET6):
                continue
            ip = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
            if ip not in found:
                found.append(ip)
        self.emit("dns.resolve", conn, host=host, addresses=[str(a) for a in found], ms=_ms(started))
        if not found:
            raise DialError("dns", f"{host}: the name has no addresses")
        return tuple(found)

    async def run_relay(self, client: socket.socket, opened: Opened, early: bytes = b"") -> None:
        """Relay until both sides end; always ends with conn.close."""
        loop = asyncio.get_running_loop()
        relay = None
        try:
            if early:
                await loop.sock_sendall(opened.sock, early)
                opened.bytes_up += len(early)
            # The relay closes its own duplicate; the caller closes the original.
            relay = Relay(socket.socket(fileno=os.dup(client.fileno())), opened.sock)
            self.relays.add(relay)
            relay.start()
            await relay.wait()
        except OSError:
            pass
        finally:
            if relay is not None:
                relay.abort()
                self.relays.discard(relay)
                opened.bytes_up += relay.bytes_up
                opened.bytes_down += relay.bytes_down
            self.close_conn(opened)

    async def recv(self, sock: socket.socket, deadline: float | None) -> bytes:
        loop = asyncio.get_running_loop()
        if deadline is None:
            return await loop.sock_recv(sock, RECV_SIZE)
        if deadline - loop.time() <= 0:
            raise asyncio.TimeoutError
        # The request usually arrived with the connection: read it without
        # arming a timer (wait_for costs a task and a timer per call).
        try:
            return sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            pass
        async with asyncio.timeout_at(deadline):
            return await loop.sock_recv(sock, RECV_SIZE)

    async def send_quietly(self, sock: socket.socket, data: bytes) -> None:
        # Replies are small: the empty send buffer takes them at once.
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return
        if sent == len(data):
            return
        try:
            async with asyncio.timeout(5):
                await asyncio.get_running_loop().sock_sendall(sock, data[sent:])
        except (OSError, asyncio.TimeoutError):
            pass

    # SOCKS5 -----------------------------------------------------------------
    async def serve_socks(self, client: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        parser = socks5.Socks5Parser()
        deadline = loop.time() + HANDSHAKE_TIMEOUT
        seen = 0
        greeted = False
        try:
            while True:
                event = parser.next_event()
                if event is socks5.NEED_DATA:
                    data = await self.recv(client, deadline)
                    if not data:
                        if seen:
                            self.fail(self.new_conn(), "handshake", "bad-request",
                                      "the client closed during the SOCKS5 handshake")
                        return
                    seen += len(data)
                    parser.feed(data)
                elif isinstance(event, socks5.Greeted):
                    greeted = True
                    await loop.sock_sendall(client, event.reply)
                elif isinstance(event, socks5.NoAcceptableMethod):
                    await self.send_quietly(client, event.reply)
                    self.fail(self.new_conn(), "handshake", "bad-request",
                              "the SOCKS5 client offered no method but no-authentication")
                    return
                elif isinstance(event, socks5.Refused):
                    await self.send_quietly(client, event.reply)
                    self.fail(self.new_conn(), "handshake", "bad-request", event.reason)
                    return
                else:
                    request = event
                    break
        except socks5.ProtocolError as exc:
            if greeted and exc.reply_code is not None:
                await self.send_quietly(client, socks5.reply(exc.reply_code))
            self.fail(self.new_conn(), "handshake", "bad-request", f"SOCKS5: {exc.reason}")
            return
        except asyncio.TimeoutError:
            self.fail(self.new_conn(), "handshake", "timeout",
                      f"no complete SOCKS5 request within {HANDSHAKE_TIMEOUT:.0f} s")
            return
        except OSError:
            return
        self.handshaking.discard(client)
        conn = self.new_conn()
        outcome = await self.connect(conn, "socks", "socks5", request.host, request.port)
        if isinstance(outcome, Denied):
            await self.send_quietly(client, socks5.reply(socks5.NOT_ALLOWED))
            return
        if isinstance(outcome, Failed):
            code = {"refused": socks5.CONNECTION_REFUSED, "unreachable": socks5.HOST_UNREACHABLE,
                    "timeout": socks5.HOST_UNREACHABLE, "dns": socks5.HOST_UNREACHABLE,
                    }.get(outcome.error, socks5.GENERAL_FAILURE)
            await self.send_quietly(client, socks5.reply(code))
            return
        try:
            try:
                bound = outcome.sock.getsockname()[:2]
            except OSError:
                bound = None
            await loop.sock_sendall(client, socks5.reply(socks5.SUCCEEDED, bound))
            await self.run_relay(client, outcome, parser.early_data())
        except OSError:
            pass
        finally:
            self.close_conn(outcome)

    # HTTP proxy -------------------------------------------------------------
    async def serve_http(self, client: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        parser = http_proxy.RequestParser()
        upstream: Opened | None = None
        upstream_key = None
        responses = None
        first = True
        try:
            while True:
                limit = HANDSHAKE_TIMEOUT if first else IDLE_TIMEOUT
                try:
                    head = await self._next_head(parser, client, loop.time() + limit)
                except http_proxy.ProtocolError as exc:
                    await self.send_quietly(client, http_proxy.error_response(exc.status, exc.reason))
                    self.fail(self.new_conn(), "handshake", "bad-request", f"HTTP: {exc.reason}")
                    return
                except asyncio.TimeoutError:
                    if first or parser.buffered:
                        await self.send_quietly(client, http_proxy.error_response(
                            408, "no complete request in time"))
                        self.fail(self.new_conn(), "handshake", "timeout",
                                  f"no complete HTTP request head within {limit:.0f} s")
                    return
                if head is None:
                    return
                first = False
                self.handshaking.discard(client)
                if isinstance(head, http_proxy.ConnectHead):
                    if upstream is not None:
                        self.close_conn(upstream)
                        upstream = None
                    conn = self.new_conn()
                    outcome = await self.connect(conn, "http", "http-connect", head.host, head.port)
                    if not isinstance(outcome, Opened):
                        await self.send_quietly(client, self._http_refusal(outcome))
                        return
                    try:
                        await loop.sock_sendall(client, http_proxy.CONNECT_OK)
                        await self.run_relay(client, outcome, parser.tunnel_data())
                    except OSError:
                        pass
                    finally:
                        self.close_conn(outcome)
                    return
                key = (head.host.lower(), head.port)
                if upstream is not None and (upstream_key != key or not _still_open(upstream.sock)):
                    self.close_conn(upstream)
                    upstream = None
                if upstream is None:
                    conn = self.new_conn()
                    outcome = await self.connect(conn, "http", "http-forward", head.host, head.port)
                    if not isinstance(outcome, Opened):
                        # The request body is not drained: the connection closes.
                        await self.send_quietly(client, self._http_refusal(outcome))
                        return
                    upstream, upstream_key = outcome, key
                    responses = http_proxy.ResponseParser()
                keep = await self._exchange(client, parser, upstream, responses, head)
                if keep == "close-upstream":
                    self.close_conn(upstream)
                    upstream = None
                elif keep != "keep":
                    return
        finally:
            if upstream is not None:
                self.close_conn(upstream)

    def _http_refusal(self, outcome) -> bytes:
        if isinstance(outcome, Denied):
            return http_proxy.error_response(403, f"denied: {outcome.reason}", deny_reason=outcome.reason)
        status = 504 if outcome.error == "timeout" else 502
        return http_proxy.error_response(status, outcome.reason)

    async def _next_head(self, parser, client, deadline):
        while True:
            event = parser.next_event()
            if event is http_proxy.NEED_DATA:
                data = await self.recv(client, deadline)
                if data:
                    parser.feed(data)
                else:
                    parser.feed_eof()
            elif event is http_proxy.CLOSED:
                return None
            elif isinstance(event, (http_proxy.ConnectHead, http_proxy.ForwardHead)):
                return event
            else:
                raise http_proxy.ProtocolError("unexpected data between requests")

    async def _exchange(self, client, parser, upstream: Opened, responses, head) -> str:
        """One request and its response. Returns "keep" (both connections
        stay), "close-upstream" (the client stays) or "close" (end)."""
        loop = asyncio.get_running_loop()
        try:
            data = head.render()
            await loop.sock_sendall(upstream.sock, data)
            upstream.bytes_up += len(data)
            responses.expect(head.method)
        except (OSError, http_proxy.ProtocolError):
            await self.send_quietly(client, http_proxy.error_response(502, "the origin closed the connection"))
            return "close"
        body = loop.create_task(self._pump_body(client, parser, upstream))
        answer = loop.create_task(self._relay_response(client, upstream, responses, head))
        try:
            done, _ = await asyncio.wait({body, answer}, return_when=asyncio.FIRST_COMPLETED)
            if body in done and body.exception() is not None:
                return "close"
            client_keeps, origin_keeps = await answer
            if not body.done():
                # The origin answered before the request body ended: neither
                # side can be trusted to be at a message boundary now.
                return "close"
            if not client_keeps:
                return "close"
            return "keep" if origin_keeps else "close-upstream"
        except (OSError, http_proxy.ProtocolError):
            return "close"
        finally:
            for task in (body, answer):
                if not task.done():
                    task.cancel()
            for task in (body, answer):
                try:
                    await task
                except BaseException:
                    pass

    async def _pump_body(self, client, parser, upstream: Opened) -> None:
        loop = asyncio.get_running_loop()
        while True:
            event = parser.next_event()
            if event is http_proxy.NEED_DATA:
                data = await loop.sock_recv(client, RECV_SIZE)
                if data:
                    parser.feed(data)
                else:
                    parser.feed_eof()
            elif isinstance(event, http_proxy.Body):
                await loop.sock_sendall(upstream.sock, event.data)
                upstream.bytes_up += len(event.data)
            elif event is http_proxy.END:
                return
            else:
                raise http_proxy.ProtocolError("unexpected event in a request body")

    async def _relay_response(self, client, upstream: Opened, responses, request) -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        final = None
        client_keeps = request.keep_alive
        try:
            while True:
                event = responses.next_event()
                if event is http_proxy.NEED_DATA:
                    data = await loop.sock_recv(upstream.sock, RECV_SIZE)
                    if data:
                        responses.feed(data)
                    else:
                        responses.feed_eof()
                elif isinstance(event, http_proxy.ResponseHead):
                    if event.status >= 200:
                        final = event
                        client_keeps = client_keeps and not event.close_delimited
                    out = event.render(close=not client_keeps)
                    await loop.sock_sendall(client, out)
                    upstream.bytes_down += len(out)
                elif isinstance(event, http_proxy.Body):
                    await loop.sock_sendall(client, event.data)
                    upstream.bytes_down += len(event.data)
                elif event is http_proxy.END:
                    if final is None:
                        raise http_proxy.ProtocolError("origin closed before answering", 502)
                    break
        except http_proxy.ProtocolError as exc:
            if final is None:
                await self.send_quietly(client, http_proxy.error_response(502, f"bad answer from the origin: {exc.reason}"))
            raise
        return client_keeps, final.keep_alive and responses.buffered == 0


def _still_open(sock: socket.socket) -> bool:
    """An idle kept-alive upstream the origin has not closed meanwhile."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        return False    # closed, or unasked-for bytes: either way not reusable
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def run_broker(handoff_fd: int, event_fd: int, status_fd: int, *, run_id: str, policy, path,
               dry_run: bool = False, grace: float = 2.0, path_reported: bool = False) -> int:
    """The broker process body; returns its exit code (0, PATH_DOWN, INTERNAL)."""
    from .local_addresses import local_addresses
    emitter = Emitter(event_fd, run_id, path=getattr(path, "name", "direct"))
    broker = None
    try:
        _raise_fd_limit()
        if policy is None:
            from ..policy import Policy
            policy = Policy.allow_all()
        if path is None:
            from ..paths import DIRECT
            path = DIRECT
        broker = Broker(emitter=emitter, status_fd=status_fd, policy=policy, path=path,
                        path_reported=path_reported,
                        dry_run=dry_run, grace=grace, local_addresses=local_addresses())
        handoff = socket.socket(fileno=handoff_fd)
        try:
            return asyncio.run(broker.run(handoff))
        finally:
            broker.emitter.flush()
            handoff.detach()
    except Exception as exc:
        _warn(f"the broker failed: {exc!r}")
        if broker is not None:
            broker.report_totals()
        return ExitCode.INTERNAL

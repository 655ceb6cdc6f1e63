"""The doors' sessions: one type per door, each serving every connection
handed over through its door, from the first byte to conn.close.

The parsers they drive are sans-I/O (socks5.py, http_proxy.py); what is
decided and dialled is the Connector's; what is written to the record, the
Journal's. A session only moves bytes and picks the door's answers. A
connection that was opened ends in one of two places, each once: `tunnel`
(relayed both ways to its end) or `KeptUpstream.drop` (a kept-alive
client's upstream); both end it through Journal.close_conn.

Plain-HTTP forwarding (absolute-URI requests) keeps connections alive: the
request head is parsed on the client side, its body streamed by its own
framing, the origin's response framed by `ResponseParser`, and only then is
the next request head read. Body bytes whose length the parser knows (the
rest of a Content-Length body, a chunk's data) go socket to socket with
os.splice (relay.BodyCopy), never through Python; heads and chunk-size lines
go through the parser. A request to the same host:port as the open
upstream connection reuses it (same host and port, same decision); any other
host:port is a new connection in the record, decided and dialled anew, so a
second request never rides the first one's permission.
"""
from __future__ import annotations

import asyncio
import socket

from stages.broker import http_proxy, socks5
from stages.broker.connector import Denied, Failed, Opened
from stages.broker.relay import BodyCopy, Relay

HANDSHAKE_TIMEOUT = 30.0    # the first request head must arrive within this (slowloris)
IDLE_TIMEOUT = 120.0        # between requests on a kept-alive client connection
# Reads into Python are heads, chunk-size lines and short bodies (longer
# bodies are spliced). 64 KiB stays below malloc's mmap threshold: a larger
# buffer costs an mmap, an mremap and a munmap on every read.
RECV_SIZE = 64 * 1024
# Body runs shorter than this are read into Python with the head: a splice
# costs a pipe and an epoll registration, which only pays for longer runs.
SPLICE_MIN = 32 * 1024


class DoorContext:
    """All a door's session may touch of the broker: the loop, the record
    (Journal), the decisions (Connector), and the run's live connections,
    which the broker ends at shutdown. The broker owns it; sessions never see
    the broker itself. (A plain class: no dataclass made on the loop's import.)"""

    def __init__(self, journal, connector, loop: asyncio.AbstractEventLoop | None = None,
                 fake_names=None):
        self.journal = journal              # journal.Journal
        self.connector = connector          # connector.Connector
        self.loop = loop                    # set when the broker's loop runs
        self.relays: set = set()            # tunnels relaying now
        self.handshaking: set = set()       # accepted, no request yet
        self.fake_names = fake_names        # the DNS door's made-up addresses, when capture is on


class _Door:
    """What every door's sessions share: the context, its Journal and Connector."""

    def __init__(self, ctx: DoorContext):
        self.ctx = ctx
        self.journal = ctx.journal
        self.connector = ctx.connector

    async def tunnel(self, client: socket.socket, opened: Opened, reply: bytes = b"",
                     early: bytes = b"") -> None:
        """`reply` to the program, `early` (what it sent past its request) to
        the destination, then both ways until both sides end: a tunnelled
        connection's whole life after conn.open, and its one end (conn.close)."""
        loop = self.ctx.loop
        relay = None
        try:
            if reply:
                await loop.sock_sendall(client, reply)
            if early:
                await loop.sock_sendall(opened.sock, early)
                opened.bytes_up += len(early)
            # The relay owns (and closes) both sockets; the caller's close of
            # `client` afterwards is a no-op.
            relay = Relay(client, opened.sock)
            self.ctx.relays.add(relay)
            relay.start()
            await relay.wait()
        except OSError:
            pass
        finally:
            if relay is not None:
                relay.abort()
                self.ctx.relays.discard(relay)
                opened.bytes_up += relay.bytes_up
                opened.bytes_down += relay.bytes_down
            self.journal.close_conn(opened)

    async def recv(self, sock: socket.socket, deadline: float | None) -> bytes:
        loop = self.ctx.loop
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
                await self.ctx.loop.sock_sendall(sock, data[sent:])
        except (OSError, asyncio.TimeoutError):
            pass


class KeptUpstream:
    """The upstream connection a kept-alive client connection holds (at most
    one at a time) and its answers' parser. `drop()` is the one way a kept
    connection ends (conn.close, through the Journal): when the client asks
    for another host, when either side will not keep it, and when the
    client's session ends."""
    __slots__ = ("journal", "opened", "key", "responses")

    def __init__(self, journal):
        self.journal = journal
        self.opened: Opened | None = None
        self.key = None
        self.responses = None

    def hold(self, opened: Opened, key=None) -> None:
        self.opened, self.key = opened, key
        self.responses = http_proxy.ResponseParser()

    def drop(self) -> None:
        opened, self.opened = self.opened, None
        if opened is not None:
            self.journal.close_conn(opened)


class _Forwarding(_Door):
    """What the doors that forward HTTP requests share (the HTTP door's
    absolute-URI requests, a secret door's): reading each request head, and
    relaying each answer to the client as it comes."""
    HEADS: tuple = ()               # the head events a request may begin with
    ORIGIN = "origin"               # the upstream side, as the doors' error answers name it
    CLOSED_EARLY = "origin closed before answering"
    SPLICES = True                  # long bodies go socket to socket (not through TLS)
    UPGRADES = False                # a 101 answer turns the connection into a relay

    async def request_head(self, parser, client: socket.socket, first: bool, what: str = ""):
        """The next request head, or None when there is none (the client
        closed, or stayed quiet between requests); a bad or late head is
        answered and written as a conn.fail of its own (`what` begins its reason)."""
        limit = HANDSHAKE_TIMEOUT if first else IDLE_TIMEOUT
        try:
            return await self._next_head(parser, client, self.ctx.loop.time() + limit)
        except http_proxy.HttpProxyError as exc:
            await self.send_quietly(client, http_proxy.error_response(exc.status, exc.reason))
            self.journal.handshake_failed("bad-request", f"{what}HTTP: {exc.reason}")
        except asyncio.TimeoutError:
            if first or parser.buffered:
                await self.send_quietly(client, http_proxy.error_response(
                    408, "no complete request in time"))
                self.journal.handshake_failed("timeout", f"no complete HTTP request head within "
                                                         f"{limit:.0f} s")
        return None

    async def _next_head(self, parser, client, deadline):
        while True:
            event = parser.next_event()
            if event is http_proxy.NEED_DATA:
                _feed(parser, await self.recv(client, deadline))
            elif event is http_proxy.CLOSED:
                return None
            elif isinstance(event, self.HEADS):
                return event
            else:
                raise http_proxy.HttpProxyError("unexpected data between requests")

    async def body_and_answer(self, pump, answer) -> str:
        """A request body still coming (`pump`) while its answer is relayed
        (`answer`): what the exchange leaves open. An answer that ends
        before the body did leaves neither side at a message boundary."""
        loop = self.ctx.loop
        body, answer = loop.create_task(pump), loop.create_task(answer)
        try:
            done, _ = await asyncio.wait({body, answer}, return_when=asyncio.FIRST_COMPLETED)
            if body in done and body.exception() is not None:
                return "close"
            keep = await answer
            if not body.done():
                return "close"
            return keep
        except (OSError, http_proxy.HttpProxyError):
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

    async def read_upstream(self, upstream: Opened) -> bytes:
        return await self.ctx.loop.sock_recv(upstream.sock, RECV_SIZE)

    async def relay_upgraded(self, client, upstream: Opened, early: bytes) -> None:
        raise NotImplementedError       # only a door that UPGRADES

    async def relay_response(self, client, upstream: Opened, responses, request,
                             parser=None) -> str:
        """One answer, head and body, to the client as it comes: what the
        exchange leaves open ("keep", "close-upstream", "close"), or
        "upgraded" (a 101 relayed to its end, where the door UPGRADES)."""
        loop = self.ctx.loop
        final = None
        client_keeps = request.keep_alive
        copier = None
        # What the parser gives from one read (a head and a short body, say)
        # goes to the client in one send.
        out: list[bytes] = []

        async def send_out() -> None:
            data = b"".join(out)
            out.clear()
            await loop.sock_sendall(client, data)
            upstream.bytes_down += len(data)

        try:
            while True:
                event = responses.next_event()
                if event is http_proxy.NEED_DATA:
                    if out:
                        await send_out()
                    ahead = responses.raw_body_ahead() if self.SPLICES else 0
                    if ahead >= SPLICE_MIN:
                        copier = copier or BodyCopy(upstream.sock, client)
                        responses.raw_body_passed(await copier.copy(ahead))
                    else:
                        _feed(responses, await self.read_upstream(upstream))
                elif isinstance(event, http_proxy.ResponseHead):
                    if event.status == 101 and self.UPGRADES:
                        out.append(event.render(close=False))
                        out.append(responses.tunnel_data())
                        await send_out()
                        await self.relay_upgraded(client, upstream, parser.tunnel_data())
                        return "upgraded"
                    if event.status >= 200:
                        final = event
                        client_keeps = client_keeps and not event.close_delimited
                    out.append(event.render(close=not client_keeps))
                elif isinstance(event, http_proxy.Body):
                    out.append(event.data)
                elif event is http_proxy.END:
                    if final is None:
                        raise http_proxy.HttpProxyError(self.CLOSED_EARLY, 502)
                    if out:
                        await send_out()
                    break
        except http_proxy.HttpProxyError as exc:
            if final is None:
                out.clear()
                await self.send_quietly(client, http_proxy.error_response(
                    502, f"bad answer from the {self.ORIGIN}: {exc.reason}"))
            elif out:
                # What came before the bad part is the client's, as it came.
                try:
                    await send_out()
                except OSError:
                    pass
            raise
        finally:
            if copier is not None:
                copier.close()
                upstream.bytes_down += copier.bytes
        return _after(client_keeps, final.keep_alive and responses.buffered == 0)


class Socks5Door(_Door):
    """SOCKS5 (RFC 1928, no authentication, CONNECT only)."""

    async def serve(self, client: socket.socket) -> None:
        request, parser = await self._request(client)
        if request is None:
            return
        self.ctx.handshaking.discard(client)
        conn = self.journal.new_conn()
        outcome = await self.connector.connect(conn, "socks", "socks5", request.host, request.port,
                                               client)
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
            bound = outcome.sock.getsockname()[:2]
        except OSError:
            bound = None
        await self.tunnel(client, outcome, socks5.reply(socks5.SUCCEEDED, bound), parser.early_data())

    async def _request(self, client: socket.socket):
        """(the CONNECT request, its parser), or (None, None) when the
        handshake did not give one (written as its own conn.fail when the
        client sent anything)."""
        loop = self.ctx.loop
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
                            self.journal.handshake_failed(
                                "bad-request", "the client closed during the SOCKS5 handshake")
                        return None, None
                    seen += len(data)
                    parser.feed(data)
                elif isinstance(event, socks5.Greeted):
                    greeted = True
                    await loop.sock_sendall(client, event.reply)
                elif isinstance(event, socks5.NoAcceptableMethod):
                    await self.send_quietly(client, event.reply)
                    self.journal.handshake_failed(
                        "bad-request", "the SOCKS5 client offered no method but no-authentication")
                    return None, None
                elif isinstance(event, socks5.SocksRefused):
                    await self.send_quietly(client, event.reply)
                    self.journal.handshake_failed("bad-request", event.reason)
                    return None, None
                else:
                    return event, parser
        except socks5.Socks5Error as exc:
            if greeted and exc.reply_code is not None:
                await self.send_quietly(client, socks5.reply(exc.reply_code))
            self.journal.handshake_failed("bad-request", f"SOCKS5: {exc.reason}")
        except asyncio.TimeoutError:
            self.journal.handshake_failed(
                "timeout", f"no complete SOCKS5 request within {HANDSHAKE_TIMEOUT:.0f} s")
        except OSError:
            pass
        return None, None


class HttpDoor(_Forwarding):
    """HTTP proxy: CONNECT tunnels and absolute-URI requests, kept alive."""
    HEADS = (http_proxy.ConnectHead, http_proxy.ForwardHead)

    async def serve(self, client: socket.socket) -> None:
        parser = http_proxy.RequestParser()
        kept = KeptUpstream(self.journal)
        first = True
        try:
            while True:
                head = await self.request_head(parser, client, first)
                if head is None:
                    return
                first = False
                self.ctx.handshaking.discard(client)
                if isinstance(head, http_proxy.ConnectHead):
                    kept.drop()
                    conn = self.journal.new_conn()
                    outcome = await self.connector.connect(conn, "http", "http-connect", head.host,
                                                           head.port, client)
                    if not isinstance(outcome, Opened):
                        await self.send_quietly(client, self._http_refusal(outcome))
                        return
                    await self.tunnel(client, outcome, http_proxy.CONNECT_OK, parser.tunnel_data())
                    return
                key = (head.host.lower(), head.port)
                if kept.opened is not None and (kept.key != key or not _still_open(kept.opened.sock)):
                    kept.drop()
                if kept.opened is None:
                    conn = self.journal.new_conn()
                    outcome = await self.connector.connect(conn, "http", "http-forward", head.host,
                                                           head.port, client)
                    if not isinstance(outcome, Opened):
                        # The request body is not drained: the connection closes.
                        await self.send_quietly(client, self._http_refusal(outcome))
                        return
                    kept.hold(outcome, key)
                keep = await self._exchange(client, parser, kept.opened, kept.responses, head)
                if keep == "close-upstream":
                    kept.drop()
                elif keep != "keep":
                    return
        finally:
            kept.drop()

    def _http_refusal(self, outcome) -> bytes:
        if isinstance(outcome, Denied):
            return http_proxy.denied_response(outcome)
        status = 504 if outcome.error == "timeout" else 502
        return http_proxy.error_response(status, outcome.reason)

    async def _exchange(self, client, parser, upstream: Opened, responses, head) -> str:
        """One request and its response. Returns "keep" (both connections
        stay), "close-upstream" (the client stays) or "close" (end)."""
        loop = self.ctx.loop
        try:
            data = head.render()
            await loop.sock_sendall(upstream.sock, data)
            upstream.bytes_up += len(data)
            responses.expect(head.method)
        except (OSError, http_proxy.HttpProxyError):
            await self.send_quietly(client, http_proxy.error_response(502, "the origin closed the connection"))
            return "close"
        if not parser.body_follows():
            # Most requests (GET, HEAD) have no body: the answer is all there
            # is to wait for, in this task (no second task, no asyncio.wait).
            parser.next_event()     # its END
            try:
                return await self.relay_response(client, upstream, responses, head)
            except (OSError, http_proxy.HttpProxyError):
                return "close"
        return await self.body_and_answer(self._pump_body(client, parser, upstream),
                                          self.relay_response(client, upstream, responses, head))

    async def _pump_body(self, client, parser, upstream: Opened) -> None:
        loop = self.ctx.loop
        copier = None
        try:
            while True:
                event = parser.next_event()
                if event is http_proxy.NEED_DATA:
                    ahead = parser.raw_body_ahead()
                    if ahead >= SPLICE_MIN:
                        copier = copier or BodyCopy(client, upstream.sock)
                        parser.raw_body_passed(await copier.copy(ahead))
                    else:
                        _feed(parser, await loop.sock_recv(client, RECV_SIZE))
                elif isinstance(event, http_proxy.Body):
                    await loop.sock_sendall(upstream.sock, event.data)
                    upstream.bytes_up += len(event.data)
                elif event is http_proxy.END:
                    return
                else:
                    raise http_proxy.HttpProxyError("unexpected event in a request body")
        finally:
            if copier is not None:
                copier.close()
                upstream.bytes_up += copier.bytes


def _after(client_keeps: bool, origin_keeps: bool) -> str:
    """What an exchange leaves open: "keep", "close-upstream" or "close"."""
    if not client_keeps:
        return "close"
    return "keep" if origin_keeps else "close-upstream"


def _feed(parser, data: bytes) -> None:
    """What a read gave a sans-I/O parser: bytes, or (b"") the end of the stream."""
    if data:
        parser.feed(data)
    else:
        parser.feed_eof()


def _still_open(sock: socket.socket) -> bool:
    """An idle kept-alive upstream the origin has not closed meanwhile."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        return False    # closed, or unasked-for bytes: either way not reusable
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False

"""The secret doors (docs/secrets.md): one plain-HTTP door per secret on the
sandbox's loopback. The program talks HTTP to it as to its API host; each
request head is read here (SecretRequestParser: the HTTP door's framing,
origin-form), checked against the secret's method and path rules, stripped
of any credential the program sent, given the real one, and sent over TLS
that the broker itself opens to the secret's one host, its certificate
verified against the system's store. The connection goes through the run's
path and is decided by the policy like any other (Connector.connect): a
secret door to a host the policy denies is denied.

The program never holds the value: it lives here, in the broker, outside
the sandbox, read by the orchestrator before the program started (or, for
a command whose time ran out, run again here). It never goes into an event:
the record keeps what it keeps for any connection, plus the secret's name,
and the method and path of a request the rules refused.

Bodies are not buffered: each read from either side goes on as it came
(an SSE or chunked answer reaches the program as the host sends it). A 101
answer to a WebSocket upgrade turns the connection into a byte relay. On a
kept-alive connection every request head is parsed and checked on its own.
"""
from __future__ import annotations

import asyncio
import socket
import ssl          # loaded only on a run with secrets: this module is then (broker/main.py)
import time

from stages.record import event_types as ev
from stages.broker import http_proxy
from stages.broker.connector import Denied, Opened
from stages.broker.dial import DialError
from stages.broker.sessions import RECV_SIZE, KeptUpstream, _feed, _Forwarding
from stages.config import secrets as sc

TLS_TIMEOUT = 15.0


class SecretKeeper:
    """The secrets' values, by door port, in the broker's lead process. A
    command's value is run again once its `cache` seconds are over; a value
    that cannot be had then refuses the request (fail closed), never a
    request without its credential."""

    def __init__(self, secrets, values: dict, ports: dict, env: dict):
        self.by_port = {ports[s.name]: s for s in secrets}
        self.values = dict(values)          # name -> secrets.Fetched
        self.env = env
        self._refreshing: dict = {}
        self._tls = None

    def secret_at(self, port: int):
        return self.by_port.get(port)

    async def credential(self, secret) -> tuple[bytes, bytes]:
        """(header name, header value) for this request; SourceError when a
        command that had to run again gave nothing."""
        held = self.values.get(secret.name)
        if held is None or (secret.source_kind == "command"
                            and time.monotonic() - held.at >= secret.cache):
            pending = self._refreshing.get(secret.name)
            if pending is None:
                pending = asyncio.ensure_future(self._run_again(secret))
                self._refreshing[secret.name] = pending
            try:
                held = await asyncio.shield(pending)
            finally:
                if pending.done():
                    self._refreshing.pop(secret.name, None)
        return sc.header_line(secret, held.value)

    async def _run_again(self, secret):
        if secret.source_kind != "command":
            raise sc.SourceError(f"{secret.says()}: the value is gone")
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", secret.source_arg, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, env=self.env)
        try:
            async with asyncio.timeout(sc.COMMAND_TIMEOUT):
                out, _ = await proc.communicate()
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise sc.SourceError(f"{secret.says()}: the command did not finish within "
                                 f"{sc.COMMAND_TIMEOUT:.0f} s when its value was fetched again") from None
        fetched = sc.from_command(secret, proc.returncode, out, time.monotonic())
        self.values[secret.name] = fetched
        return fetched

    def tls_context(self):
        """The client context, made once: the system's store (SSL_CERT_FILE
        and SSL_CERT_DIR as OpenSSL reads them), the host name checked."""
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls


class SecretDoor(_Forwarding):
    """A secret's door: each request checked, given the credential and
    forwarded over the broker's own TLS to the secret's host."""
    HEADS = (http_proxy.SecretHead,)
    ORIGIN = "host"
    CLOSED_EARLY = "the host closed before answering"
    SPLICES = False                 # the upstream is TLS: every byte goes through the stream
    UPGRADES = True                 # WebSocket

    def __init__(self, ctx, keeper: SecretKeeper | None):
        super().__init__(ctx)
        self.keeper = keeper

    async def serve(self, client: socket.socket) -> None:
        try:
            door_port = client.getsockname()[1]
        except OSError:
            return
        secret = self.keeper.secret_at(door_port) if self.keeper is not None else None
        if secret is None:
            return
        names = sc.CREDENTIAL_HEADERS | {secret.header_name.lower()}
        try:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # as the upstream's (_tls_for)
        except OSError:
            pass
        parser = http_proxy.SecretRequestParser(secret.host, secret.port, door_port, names)
        kept = KeptUpstream(self.journal)
        first = True
        try:
            while True:
                head = await self.request_head(parser, client, first, f"secret door {secret.name}: ")
                if head is None:
                    return
                first = False
                self.ctx.handshaking.discard(client)
                if await self._one_request(client, parser, secret, head, kept) != "keep":
                    return
        finally:
            kept.drop()

    async def _one_request(self, client, parser, secret, head, kept: KeptUpstream) -> str:
        """One request through the door: refused by the secret's rules, or
        given its credential and exchanged on the kept upstream (dialled,
        and decided, when there is none). "keep": the next request may follow."""
        refused = _rules_refuse(secret, head)
        if refused is not None and not self.connector.dry_run:
            await self._refuse(client, self._requested(secret), secret, head, refused)
            return "close"
        try:
            credential = await self.keeper.credential(secret)
        except sc.SourceError as exc:
            self.journal.fail(ev.ConnFail(self._requested(secret), stage="resolve", error="internal",
                                          reason=str(exc)))
            await self.send_quietly(client, http_proxy.error_response(502, str(exc)))
            return "close"
        if kept.opened is not None and (kept.opened.stream[0].at_eof()
                                        or kept.opened.stream[1].is_closing()
                                        or not _still_open(kept.opened.sock)):
            kept.drop()
        if kept.opened is None:
            outcome = await self.connector.connect(
                self.journal.new_conn(), "secret", "secret", secret.host, secret.port,
                finish=self._tls_for(secret), secret=secret.name)
            if not isinstance(outcome, Opened):
                await self.send_quietly(client, _refusal(outcome))
                return "close"
            kept.hold(outcome)
        if refused is not None:
            # --dry-run: the request goes on, its would-be denial on the
            # connection that carries it.
            await self._refuse(client, kept.opened.conn, secret, head, refused, enforced=False)
        keep = await self._exchange(client, parser, kept.opened, kept.responses, head, credential)
        if keep == "close-upstream":
            kept.drop()
            return "keep"
        return keep

    def _requested(self, secret) -> int:
        """A new connection's number and its conn.request, for a request
        that ends before the connector sees it."""
        conn = self.journal.new_conn()
        self.journal.emit(ev.ConnRequest(conn, door="secret", kind="secret", host=secret.host,
                                         port=secret.port, secret=secret.name))
        return conn

    async def _refuse(self, client, conn: int, secret, head, why: str, enforced: bool = True) -> None:
        """A request the secret's rules refuse: a denial in the record with
        its method and path (never a header or the body), and a 403 whose
        body says why; under --dry-run only the record's would-be denial."""
        path = head.target.split(b"?", 1)[0].decode("ascii", "replace")[:400]
        reason = f"secret door {secret.name}: {why}"
        self.journal.deny(ev.PolicyDeny(conn, rule=f"secrets.{secret.name}.allow", reason=reason,
                                        enforced=enforced, host=secret.host, port=secret.port,
                                        door="secret", method=head.method.decode("ascii", "replace"),
                                        path=path))
        if enforced:
            await self.send_quietly(client, http_proxy.error_response(403, f"denied: {reason}",
                                                                      deny_reason=reason))

    def _tls_for(self, secret):
        async def finish(sock: socket.socket, host: str):
            # A head and its body are separate writes, each answer waited
            # for: without this the body waits for the host's delayed ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                async with asyncio.timeout(TLS_TIMEOUT):
                    return await asyncio.open_connection(
                        sock=sock, ssl=self.keeper.tls_context(), server_hostname=secret.host,
                        ssl_handshake_timeout=TLS_TIMEOUT, limit=RECV_SIZE)
            except ssl.SSLCertVerificationError as exc:
                raise DialError("tls", f"{secret.host}: its certificate was not verified "
                                       f"({exc.verify_message or exc.reason})") from None
            except (ssl.SSLError, OSError, asyncio.TimeoutError) as exc:
                what = "timed out" if isinstance(exc, asyncio.TimeoutError) else (
                    getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__)
                raise DialError("tls", f"{secret.host}: the TLS handshake failed ({what})") from None
        return finish

    async def _exchange(self, client, parser, upstream: Opened, responses, head, credential) -> str:
        """One request and its answer: "keep", "close-upstream", "close" or
        "upgraded" (a WebSocket relayed to its end)."""
        reader, writer = upstream.stream
        try:
            # The head and what of the body already came go in one write (a
            # model's JSON request usually arrives whole with its head).
            pieces = [head.render(credential)]
            no_body = not parser.body_follows()
            whole = no_body
            while not whole:
                event = parser.next_event()
                if isinstance(event, http_proxy.Body):
                    pieces.append(event.data)
                    continue
                if event is http_proxy.END:
                    whole = True
                elif event is not http_proxy.NEED_DATA:
                    raise http_proxy.HttpProxyError("unexpected event in a request body")
                break
            data = b"".join(pieces)
            writer.write(data)
            upstream.bytes_up += len(data)
            responses.expect(head.method, upgrade=head.upgrade)
        except (OSError, http_proxy.HttpProxyError):
            await self.send_quietly(client, http_proxy.error_response(502, "the host closed the connection"))
            return "close"
        if whole:
            if no_body:
                parser.next_event()     # its END (a body's END was taken above)
            try:
                return await self.relay_response(client, upstream, responses, head, parser)
            except (OSError, http_proxy.HttpProxyError):
                return "close"
        return await self.body_and_answer(self._pump_body(client, parser, upstream),
                                          self.relay_response(client, upstream, responses, head, parser))

    async def _pump_body(self, client, parser, upstream: Opened) -> None:
        loop = self.ctx.loop
        _, writer = upstream.stream
        while True:
            event = parser.next_event()
            if event is http_proxy.NEED_DATA:
                _feed(parser, await loop.sock_recv(client, RECV_SIZE))
            elif isinstance(event, http_proxy.Body):
                writer.write(event.data)
                upstream.bytes_up += len(event.data)
                await writer.drain()
            elif event is http_proxy.END:
                return
            else:
                raise http_proxy.HttpProxyError("unexpected event in a request body")

    async def read_upstream(self, upstream: Opened) -> bytes:
        return await upstream.stream[0].read(RECV_SIZE)

    async def relay_upgraded(self, client, upstream: Opened, early: bytes) -> None:
        """After a 101: bytes both ways until either side ends."""
        loop = self.ctx.loop
        reader, writer = upstream.stream
        if early:
            writer.write(early)
            upstream.bytes_up += len(early)

        async def up():
            while True:
                data = await loop.sock_recv(client, RECV_SIZE)
                if not data:
                    break
                writer.write(data)
                upstream.bytes_up += len(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()

        async def down():
            while True:
                data = await reader.read(RECV_SIZE)
                if not data:
                    break
                await loop.sock_sendall(client, data)
                upstream.bytes_down += len(data)
            try:
                client.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        tasks = [loop.create_task(up()), loop.create_task(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                try:
                    await task
                except BaseException:
                    pass


def _rules_refuse(secret, head) -> str | None:
    """Why the secret's method and path rules refuse this request (a path
    that could fool them included); None when they let it through."""
    if secret.allow is None:
        return None
    bad = sc.unsafe_path(head.target)
    if bad:
        return f"{head.target.decode('ascii', 'replace')[:200]}: {bad}"
    return sc.request_allowed(secret, head.method, head.target)


def _refusal(outcome) -> bytes:
    """The answer to a request the connector did not open (as the HTTP door's)."""
    if isinstance(outcome, Denied):
        return http_proxy.error_response(403, f"denied: {outcome.reason}", deny_reason=outcome.reason)
    status = 504 if outcome.error == "timeout" else 502
    return http_proxy.error_response(status, outcome.reason)


def _still_open(sock: socket.socket) -> bool:
    """An idle kept-alive upstream the host has not closed meanwhile. (TLS
    may hold a session ticket or an alert unread: only a closed socket
    counts, never bytes waiting.)"""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False

"""The machine's own loopback, by rule (docs/architecture.md "The machine's
own loopback"): an allow rule written exactly `localhost:PORT` opens a door
on that port of the sandbox's loopback, and this session forwards each
connection there to the same port on the machine's loopback (the broker
runs in the machine's network namespace). Nothing else of the machine's
loopback is reachable: deny_private still refuses localhost and 127.0.0.0/8
at every other door; the rule is an exception for exactly that port, here.

The path is not used: the machine's own services are this machine's, never
reached through a proxy or a tunnel.
"""
from __future__ import annotations

import socket
import time

from stages.record import event_types as ev
from stages.broker.connector import Failed, Opened
from stages.broker.journal import ms_since
from stages.broker.sessions import _Door
from stages.config.policy import localhost_rule

LOOPBACKS = ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"))


class LocalDoor(_Door):

    async def serve(self, client: socket.socket) -> None:
        self.ctx.handshaking.discard(client)
        try:
            port = client.getsockname()[1]
        except OSError:
            return
        conn = self.journal.new_conn()
        self.journal.emit(ev.ConnRequest(conn, door="local", kind="local", host="localhost", port=port))
        policy = self.connector.policy
        rule = localhost_rule(policy, port)
        if rule is None:      # a deny rule on localhost took it back
            self.journal.deny(ev.PolicyDeny(
                conn, rule="localhost", enforced=True, host="localhost", port=port, door="local",
                reason=f"localhost:{port}: a deny rule refuses it; the machine's own "
                       f"loopback is reached only by an allow rule localhost:{port}"))
            return
        self.journal.emit(ev.PolicyAllow(
            conn, rule=f"allow {rule.label()}", host="localhost", port=port, door="local",
            reason=f'localhost:{port} matches allow rule "{rule.text}" '
                   f"({policy.where(rule)}): the machine's own loopback, this port only"))
        outcome = await self._dial(conn, port)
        if not isinstance(outcome, Opened):
            self.journal.fail(ev.ConnFail(conn, stage=outcome.stage, error=outcome.error,
                                          reason=outcome.reason))
            return
        self.journal.emit(ev.ConnOpen(conn, address=outcome.address, port=port, via="localhost",
                                      ms=outcome.dial_ms))
        await self.tunnel(client, outcome)

    async def _dial(self, conn: int, port: int) -> Opened | Failed:
        started = time.monotonic()
        refused = None
        for family, address in LOOPBACKS:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await self.ctx.loop.sock_connect(sock, (address, port))
            except OSError as exc:
                sock.close()
                refused = exc
                continue
            return Opened(conn, sock, address, port, ms_since(started), time.monotonic())
        reason = refused.strerror if refused is not None and refused.strerror else str(refused)
        return Failed("dial", "refused", f"nothing answers on the machine's localhost:{port} ({reason})")

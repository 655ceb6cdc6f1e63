"""Holding a connection while the person is asked (`guard --ask`).

The broker never asks anyone itself: it sends the destination over its ask
link (a SOCK_SEQPACKET socket pair made by the orchestrator, one message a
question or an answer) and the connection waits. The orchestrator is the one
place that asks, on vpnw's own terminal or through `vpnw ask`
(docs/architecture.md, "Ask"). A broker worker (workers.py) makes a link of
its own when it starts and hands the orchestrator its end over the lead's
link (`for_worker`): each process reads only the answers to its own
questions, and the orchestrator, holding every question of the run, asks
the person once per destination whichever process asked.

Within this process a destination is asked once: the other connections to
it wait on the same future. An answer the person gave for the run (not
"now", which is only for the connections waiting on it) holds for the rest
of the run over the scope the person chose (the overlay): the host and
port, the host, or every name under a suffix; later connections it covers
are decided here without asking again, since the policy object itself is
frozen.

Nothing is looked up and nothing is dialed while a connection waits: the
connector asks before it resolves anything.
"""
from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

import orjson

MAX_MESSAGE = 4096


@dataclass(frozen=True)
class HoldAnswer:
    allow: bool
    answer: str        # once | run | always | deny | deny-always
    by: str            # person | timeout | no-terminal | ended
    note: str = ""
    scope: str = ""    # the rule the person's answer covers ("pypi.org:443", "pypi.org", "*.x.org")


# Answers that hold for the rest of the run ("once" is for the connections waiting now).
HELD = frozenset({"run", "always", "deny", "deny-always"})


def covers(rule: str, host: str, port: int) -> bool:
    """Whether an answer for `rule` (as asker.rule_for writes it) covers host:port."""
    if rule.startswith("*."):
        return host.endswith(rule[1:]) and len(host) > len(rule) - 1
    exact = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return rule in (host, exact)


ENDED = HoldAnswer(False, "deny", "ended", "vpnw's asking side is gone")


class Hold:
    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(False)
        self.overlay: list[HoldAnswer] = []       # newest last
        self.waiting: dict[tuple[str, int], asyncio.Future] = {}
        self.numbers: dict[int, tuple[str, int]] = {}
        self.last = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    @classmethod
    def for_worker(cls, lead_fd: int) -> "Hold":
        """A worker's own link: its far end goes to the orchestrator over the
        lead's link (one message, SCM_RIGHTS); the lead's link is then
        closed in this process, which never reads it."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lead = socket.socket(fileno=lead_fd)
        try:
            socket.send_fds(lead, [b'{"channel": true}'], [theirs.fileno()])
        except OSError:
            ours.close()        # the orchestrator is gone: every question is denied (_end)
            ours, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        finally:
            theirs.close()
            lead.close()
        return cls(ours.detach())

    async def ask(self, host: str, port: int, door: str) -> HoldAnswer:
        key = (host, port)
        known = self._held(host, port)
        if known is not None:
            return known
        future = self.waiting.get(key)
        if future is None:
            future = self._send(key, door)
        return await asyncio.shield(future)

    def _held(self, host: str, port: int) -> HoldAnswer | None:
        """The person's answer held for host:port, the narrowest rule first."""
        found = [a for a in self.overlay if covers(a.scope, host, port)]
        if not found:
            return None
        return min(reversed(found), key=lambda a: (a.scope.startswith("*."), ":" not in a.scope))

    def _send(self, key: tuple[str, int], door: str) -> asyncio.Future:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
            self.loop.add_reader(self.sock.fileno(), self._on_readable)
        future = self.loop.create_future()
        if self.closed:
            future.set_result(ENDED)
            return future
        self.last += 1
        message = orjson.dumps({"n": self.last, "host": key[0], "port": key[1], "door": door})
        try:
            self.sock.send(message)
        except OSError:
            future.set_result(ENDED)
            return future
        self.waiting[key] = future
        self.numbers[self.last] = key
        return future

    def _on_readable(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._end()
                return
            self._on_message(data)

    def _on_message(self, data: bytes) -> None:
        try:
            message = orjson.loads(data)
            key = self.numbers.pop(int(message["n"]))
            answer = HoldAnswer(bool(message["allow"]), str(message["answer"]), str(message["by"]),
                            str(message.get("note", "")), str(message.get("scope", "")))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return     # not an answer to a question of ours: nothing is allowed by it
        if answer.by == "person" and answer.answer in HELD and answer.scope:
            self.overlay.append(answer)
        future = self.waiting.pop(key, None)
        if future is not None and not future.done():
            future.set_result(answer)

    def _end(self) -> None:
        """The orchestrator's end is closed: every waiting connection is denied."""
        self.closed = True
        if self.loop is not None:
            self.loop.remove_reader(self.sock.fileno())
        for future in self.waiting.values():
            if not future.done():
                future.set_result(ENDED)
        self.waiting.clear()
        self.numbers.clear()

"""`--syslog [TARGET]`: the recorder's syslog copy of the events.

A side output like `--events-to`: rendered (stages/recorder/shipping/syslog.py), then
handed to a BoundedFeeder on a non-blocking socket, so a target that is
slow, stuck or gone never holds the recorder and so never holds the
program. What it cannot take is dropped and counted (`run.end`'s
`syslog_lost`); the run file stays the one complete copy.

Datagram targets (/dev/log, udp://) get one message per send(2); on TCP the
messages are octet-counted (RFC 6587) and may be cut between writes like any
stream. A target that refuses (nobody listening, the daemon gone) loses the
rest of the run's copy, counted: vpnw does not reconnect within a run (over
UDP a refusal speaks of one datagram, and only that one is lost). Over UDP
only what the kernel would not take can be counted; a datagram lost in
the network is invisible to the sender (use tcp:// where that matters).
"""
from __future__ import annotations

import errno
import time

from stages.record.events import split_digest
from stages.recorder.shipping.syslog import SyslogMessages, octet_counted
from stages.recorder.shipping.transports import open_socket, parse_target
from stages.recorder import say
from stages.recorder.feeder import BoundedFeeder


class _DatagramFeeder(BoundedFeeder):
    """A BoundedFeeder whose every write is one whole message: a datagram
    socket sends each write as one datagram, so messages are never joined."""

    def _next_write(self) -> bytes:
        return self._lines[0]


# On a connected UDP socket these speak of one datagram (an ICMP answer to an
# earlier one, a full device queue), not of the socket: a collector that was
# restarting takes the next one.
_UDP_TRANSIENT = {errno.ECONNREFUSED, errno.ENOBUFS, errno.EHOSTUNREACH, errno.ENETUNREACH,
                  errno.EHOSTDOWN}


class _UdpFeeder(_DatagramFeeder):
    def _gone(self, exc: OSError) -> None:
        if exc.errno in _UDP_TRANSIENT and self._lines:
            head = self._lines.popleft()
            self._queued -= len(head)
            self.lost += 1
            self.error = exc
            return
        super()._gone(exc)


def _lost_text(target, error: OSError | None) -> str:
    """Why the syslog copy lost messages: a UDP target that answers "port
    unreachable" has nothing listening; anything else is a slow collector."""
    if error is not None and error.errno == errno.ECONNREFUSED:
        return (f"syslog {target} refuses messages: nothing listens there (connection refused); "
                "they are dropped from its copy (counted in run.end), never from the record")
    return (f"syslog {target} is not keeping up; messages it cannot take are dropped "
            "from its copy (counted in run.end), never from the record")


class SyslogOut:
    DRAIN_GRACE = 1.0
    IDLE = 0.25

    def __init__(self, target: str | None, fmt: str = "jsonl"):
        self.target = parse_target(target)
        self.messages = SyslogMessages(fmt=fmt, local=self.target.local_format)
        self.hurry = False
        self.run = None
        self._lines = self._head_line = 0
        self._head_time = time.monotonic()
        self.heads_dropped = 0
        self.unsent = 0            # messages for a target that could not be opened
        self._said = False
        try:
            self.sock = open_socket(self.target)
        except OSError as exc:
            self.sock = None
            self.feeder = None
            say(f"cannot send to syslog {self.target}: {exc.strerror or exc}; "
                "the run is still recorded to its file (losses counted in run.end)")
            return
        feeder = {"unix": _DatagramFeeder, "udp": _UdpFeeder, "tcp": BoundedFeeder}[self.target.kind]
        self.feeder = feeder(self.sock.fileno())

    @property
    def fd(self) -> int | None:
        return self.feeder.fd if self.feeder else None

    @property
    def lost(self) -> int:
        held = self.feeder.lost if self.feeder else 0
        return held + self.unsent + self.messages.unfit

    def wants_write(self) -> bool:
        return self.feeder is not None and self.feeder.wants_write()

    def write(self, event: dict, raw: bytes) -> None:
        for message in self.messages.feed(event, raw):
            self._offer(message)
        self.pump()

    def _offer(self, message: bytes) -> None:
        if self.feeder is None:
            self.unsent += 1
            return
        self.feeder.offer(message if self.target.datagrams else octet_counted(message))

    # The chain's head leaves the machine at run.start, at a checkpoint every
    # CHECKPOINT_LINES lines or CHECKPOINT_SECONDS (whichever comes first, at
    # the end of a batch), at run.end, and once the run is signed.
    CHECKPOINT_LINES = 256
    CHECKPOINT_SECONDS = 5.0

    def after_batch(self, sealed: list) -> None:
        """`sealed`: the batch just recorded, [(event, line)]; one head at most."""
        self._lines += len(sealed)
        first, last = sealed[0][0], sealed[-1][0]
        at = None
        if last.get("type") == "run.end":
            at = "run.end"
        elif self._lines == len(sealed) and first.get("type") == "run.start":
            at = "run.start"
        elif self._lines - self._head_line >= self.CHECKPOINT_LINES or \
                time.monotonic() - self._head_time >= self.CHECKPOINT_SECONDS:
            at = "checkpoint"
        if at is not None:
            self.run = last.get("run") if isinstance(last.get("run"), str) else self.run
            self.head(at, sealed[-1][1], last.get("ts"))

    def head(self, at: str, line: bytes, ts, **extra) -> None:
        parts = split_digest(line.rstrip(b"\n"))
        if parts is None:
            return
        self._head_line, self._head_time = self._lines, time.monotonic()
        doc = {"run": self.run, "at": at, "line": self._lines, "d": parts[1].decode(), **extra}
        self._offer_head(self.messages.chain_head(doc, ts if isinstance(ts, str) else ""))

    def _offer_head(self, message: bytes) -> None:
        """A head goes only to a copy that is keeping up: never queued behind
        events (the next head says more), never counted in syslog_lost,
        which counts the events' copy."""
        if self.feeder is None or self.feeder.closed or self.feeder.wants_write():
            self.heads_dropped += 1
            return
        if self.target.datagrams:
            try:
                self.sock.send(message)        # one datagram, whole or not at all
            except OSError:
                self.heads_dropped += 1
            return
        self.feeder.offer(octet_counted(message))
        self.pump()

    def sealed(self, last_line: bytes, ts, ledger_seq, ledger_d, key: str) -> None:
        """The run signed and entered in the ledger: the ledger's place and
        head go off the machine too (a ledger cut later disagrees)."""
        self.head("sealed", last_line, ts, ledger=ledger_seq, ledger_d=ledger_d, key=key)

    def pump(self) -> None:
        if self.feeder is None:
            return
        was_open = not self.feeder.closed
        self.feeder.pump()
        if was_open and self.feeder.closed:
            exc = self.feeder.error
            say(f"syslog {self.target} stopped taking messages ({(exc.strerror if exc else None) or exc}); "
                "the rest of the run is still recorded to its file (losses counted in run.end)")
        elif self.feeder.lost and not self._said and not self.feeder.closed:
            self._said = True
            say(_lost_text(self.target, self.feeder.error))

    def lost_before_end(self) -> int:
        """Before run.end: a last bounded chance for the backlog, then what the
        copy lost so far (run.end's syslog_lost)."""
        if self.feeder is not None:
            if not self.hurry:
                self.feeder.drain(time.monotonic() + self.DRAIN_GRACE, self.IDLE)
            self.feeder.drop_pending()
        return self.lost

    def close(self) -> None:
        if self.feeder is None:
            return
        if self.feeder.wants_write() and not self.hurry:
            self.feeder.drain(time.monotonic() + self.IDLE, self.IDLE)
        self.feeder.drop_pending()
        if self.target.kind == "tcp" and not self.feeder.closed:
            try:
                self.sock.shutdown(1)     # SHUT_WR: the collector sees the end of the stream
            except OSError:
                pass
        self.feeder.close()
        self.sock.detach()

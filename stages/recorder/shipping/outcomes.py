"""A run's events folded into connection outcomes: what each security schema
describes as one network-activity event.

The record tells a connection in several events (request, lookup, decision,
open, close); OCSF and ECS want one document per thing that happened to a
connection, carrying the destination each time. `Outcomes.feed(event)` keeps
what it needs per open connection and returns the outcomes an event completes:

| record event                     | outcome  |
|----------------------------------|----------|
| `policy.deny` (enforced)         | refuse   |
| `conn.open`                      | open     |
| `conn.close`                     | close    |
| `conn.fail`                      | fail     |
| `unix.deny`                      | unix-refuse |
| `unix.allow`                     | unix-open   |

A `policy.deny` that was not enforced (`--dry-run`) is not an outcome by
itself: the connection goes on, and its open, close or fail carry the rule
that would have denied it (`would_deny`). Every other event only updates what
is known (the run's program and version from `run.start`, a destination from
`conn.request`, addresses from `dns.resolve`, the rule from `policy.allow`).

Pure: no I/O. Memory is bounded by the connections open at once, and capped
(`MAX_OPEN`) so a program that opens connections it never closes cannot grow
it without end; a connection dropped from the table still renders, with
less known about it.
"""
from __future__ import annotations

import calendar
import ipaddress
from dataclasses import dataclass, field

MAX_OPEN = 65536

OUTCOME_OF_TYPE = {"conn.open": "open", "conn.close": "close", "conn.fail": "fail"}
# A connect() to a Unix socket outside the sandbox: one event says it all
# (the socket's path, the process, the decision), so it is its own outcome.
UNIX_OUTCOMES = {"unix.deny": "unix-refuse", "unix.allow": "unix-open"}


# Longest duration a document carries: ECS counts nanoseconds in a signed
# 64-bit integer (about 292 years); an odd event's "ms" beyond it, or below
# zero, is left out rather than break the rendering.
MAX_DURATION_MS = (2**63 - 1) // 1_000_000


# Syslog severities (RFC 5424), and each event's: the syslog header and the
# ECS document both carry it.
EMERG, ALERT, CRIT, ERROR, WARNING, NOTICE, INFO, DEBUG = range(8)


def severity(event: dict) -> int:
    type_ = event.get("type")
    f = event.get("fields") or {}
    if type_ == "policy.deny":
        return WARNING if f.get("enforced", True) is not False else NOTICE
    if type_ == "unix.deny":
        return WARNING
    if type_ == "run.end":
        return ERROR if f.get("error") else INFO
    if type_ == "path.check":
        return ERROR if f.get("ok") is False else INFO
    if type_ == "conn.fail":
        return ERROR if f.get("error") == "internal" else NOTICE
    if type_ == "dns.resolve" and f.get("error"):
        return NOTICE
    return INFO


def duration_ms(value) -> int | None:
    """An event's `ms` as a duration a document can carry, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not 0 <= value <= MAX_DURATION_MS:      # NaN fails both comparisons
        return None
    return int(value)


def epoch_ms(ts: str) -> int:
    """RFC 3339 UTC as the record writes it (`2026-09-29T11:44:36.754728731Z`)
    -> milliseconds since the epoch. Sliced by hand: strptime costs an import."""
    try:
        secs = calendar.timegm((int(ts[0:4]), int(ts[5:7]), int(ts[8:10]),
                                int(ts[11:13]), int(ts[14:16]), int(ts[17:19]), 0, 0, 0))
        frac = ts[20:23] if len(ts) > 20 and ts[19] == "." else "0"
        return secs * 1000 + int(frac.ljust(3, "0")[:3])
    except (ValueError, IndexError):
        return 0


def ip_version(text) -> int | None:
    """4 or 6 when `text` is an IP address, else None (a name, or nothing)."""
    if not isinstance(text, str):
        return None
    try:
        return ipaddress.ip_address(text.strip("[]")).version
    except ValueError:
        return None


@dataclass
class RunInfo:
    run: str | None = None
    program: str | None = None
    version: str | None = None
    policy: str | None = None
    mode: str | None = None
    vpnw_pid: int | None = None    # the orchestrator's pid, from run.start


@dataclass
class Connection:
    conn: int
    host: str | None = None        # as asked: a name or an address
    port: int | None = None
    door: str | None = None
    kind: str | None = None
    addresses: list = field(default_factory=list)   # from dns.resolve
    address: str | None = None     # dialled (conn.open)
    rule: str | None = None        # the rule that decided
    reason: str | None = None
    would_deny: bool = False       # dry run: the policy would have denied it
    opened_ts: str | None = None


@dataclass
class Outcome:
    kind: str                      # open | close | refuse | fail | unix-refuse | unix-open
    event: dict                    # the record event that completed it
    connection: Connection
    run: RunInfo

    @property
    def fields(self) -> dict:
        return self.event["fields"]

    @property
    def ip(self) -> str | None:
        """The destination's address when the record knows exactly one."""
        c = self.connection
        for candidate in (c.address, c.host):
            if ip_version(candidate):
                return candidate.strip("[]")
        if len(c.addresses) == 1 and ip_version(c.addresses[0]):
            return c.addresses[0]
        return None

    @property
    def domain(self) -> str | None:
        """The destination's name, when it was asked for by name."""
        host = self.connection.host
        return host if isinstance(host, str) and host and not ip_version(host) else None


def _str(value):
    return value if isinstance(value, str) else None


def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _decisions_destination(c: Connection, f: dict) -> None:
    """A decision names its destination itself (docs/record.md): a connection
    whose conn.request was not seen (a stream joined late, a table that was
    full) still renders with its host, port and door."""
    if c.host is None:
        c.host = _str(f.get("host"))
    if c.port is None:
        c.port = _int(f.get("port"))
    if c.door is None:
        c.door = _str(f.get("door"))


class Outcomes:
    def __init__(self):
        self.run = RunInfo()
        self.open: dict[int, Connection] = {}

    def _connection(self, conn: int) -> Connection:
        c = self.open.get(conn)
        if c is None:
            if len(self.open) >= MAX_OPEN:
                self.open.pop(next(iter(self.open)))
            c = self.open[conn] = Connection(conn)
        return c

    def feed(self, event: dict) -> list[Outcome]:
        type_ = event.get("type")
        f = event.get("fields") or {}
        if type_ == "run.start":
            self.run = RunInfo(run=_str(event.get("run")), program=_str(f.get("program")),
                               version=_str(f.get("version")), policy=_str(f.get("policy")),
                               mode=_str(f.get("mode")), vpnw_pid=_int(event.get("pid")))
            return []
        if self.run.run is None:
            self.run.run = _str(event.get("run"))
        if type_ in UNIX_OUTCOMES:
            return [Outcome(UNIX_OUTCOMES[type_], event, Connection(0), self.run)]
        conn = _int(event.get("conn"))
        if conn is None:
            return []
        c = self._connection(conn)
        if type_ == "conn.request":
            c.host, c.port = _str(f.get("host")), _int(f.get("port"))
            c.door, c.kind = _str(f.get("door")), _str(f.get("kind"))
            return []
        if type_ == "dns.resolve":
            addresses = f.get("addresses")
            c.addresses = [a for a in addresses if isinstance(a, str)] if isinstance(addresses, list) else []
            return []
        if type_ == "policy.allow":
            c.rule, c.reason = _str(f.get("rule")), _str(f.get("reason"))
            _decisions_destination(c, f)
            return []
        if type_ == "policy.deny":
            c.rule, c.reason = _str(f.get("rule")), _str(f.get("reason"))
            _decisions_destination(c, f)
            if f.get("enforced", True) is False:
                c.would_deny = True
                return []
            self.open.pop(conn, None)
            return [Outcome("refuse", event, c, self.run)]
        kind = OUTCOME_OF_TYPE.get(type_)
        if kind is None:
            return []
        if kind == "open":
            c.address = _str(f.get("address"))
            if _int(f.get("port")) is not None:
                c.port = f["port"]
            c.opened_ts = _str(event.get("ts"))
        else:
            self.open.pop(conn, None)
        return [Outcome(kind, event, c, self.run)]

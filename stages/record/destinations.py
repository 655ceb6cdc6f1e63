"""Per-destination totals of recorded runs: one entry per host and port.

Shared by `vpnw show --summary` and the learner, which both read a record as a
stream: memory holds one entry per destination and one per connection still
open in the record, never the events themselves.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable


MAX_ADDRESSES = 8   # a hostile record cannot make one entry grow without bound


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass
class Destination:
    host: str
    port: int
    requests: int = 0
    opened: int = 0
    denied: int = 0
    would_deny: int = 0
    failed: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    first: str | None = None           # ts of the first request
    last: str | None = None            # ts of the last request
    deny_reason: str | None = None
    would_deny_reason: str | None = None
    fail_reason: str | None = None
    addresses: list[str] = field(default_factory=list)   # where it was opened, first few

    @property
    def decision(self) -> str:
        outcomes = [name for name, n in (("allowed", self.opened - self.would_deny),
                                         ("would deny", self.would_deny),
                                         ("denied", self.denied), ("failed", self.failed)) if n > 0]
        return "/".join(outcomes) or "pending"

    def as_dict(self) -> dict:
        return {**asdict(self), "decision": self.decision}


class Tally:
    """Feed it events (of one or several runs); read `.table`."""

    def __init__(self):
        self.table: dict[tuple[str, int], Destination] = {}
        self._open: dict[tuple, Destination] = {}     # (run, conn) -> its destination

    def feed(self, event: dict) -> None:
        type_, f = event.get("type"), event.get("fields")
        if not isinstance(f, dict):
            return
        key = (event.get("run"), event.get("conn"))
        ts = event.get("ts") if isinstance(event.get("ts"), str) else None
        if type_ == "conn.request":
            host, port = f.get("host"), f.get("port")
            if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
                return
            dest = self.table.get((host, port))
            if dest is None:
                dest = self.table[(host, port)] = Destination(host, port)
            dest.requests += 1
            if ts is not None:
                dest.first = ts if dest.first is None else min(dest.first, ts)
                dest.last = ts if dest.last is None else max(dest.last, ts)
            self._open[key] = dest
            return
        dest = self._open.get(key)
        if dest is None:
            return
        if type_ == "policy.deny":
            if f.get("enforced", True) is False:
                dest.would_deny += 1
                dest.would_deny_reason = dest.would_deny_reason or str(f.get("reason", ""))
            else:
                dest.denied += 1
                dest.deny_reason = dest.deny_reason or str(f.get("reason", ""))
                del self._open[key]
        elif type_ == "conn.open":
            dest.opened += 1
            address = f.get("address")
            if isinstance(address, str) and address not in dest.addresses \
                    and len(dest.addresses) < MAX_ADDRESSES:
                dest.addresses.append(address)
        elif type_ == "conn.fail":
            dest.failed += 1
            dest.fail_reason = dest.fail_reason or str(f.get("reason") or f.get("error") or "")
            del self._open[key]
        elif type_ == "conn.close":
            dest.bytes_up += _count(f.get("bytes_up"))
            dest.bytes_down += _count(f.get("bytes_down"))
            del self._open[key]

    def sorted(self) -> list[Destination]:
        return sorted(self.table.values(), key=lambda d: (d.host, d.port))


def destinations(events: Iterable[dict]) -> list[Destination]:
    tally = Tally()
    for event in events:
        tally.feed(event)
    return tally.sorted()

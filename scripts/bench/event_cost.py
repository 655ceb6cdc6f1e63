"""Benchmark: the broker's cost per event, written as the broker writes them.

One connection's five events (conn.request, dns.resolve, policy.allow,
conn.open, conn.close) through the broker's Journal into a held Emitter,
flushed once per connection (as the loop flushes once per turn) to
/dev/null; the median of ROUNDS rounds of N connections, per event, in
microseconds of this thread's CPU time (on a shared machine the wall clock
measures the neighbours). Each event is made as the broker makes it: its kind's type
(stages/record/event_types.py); `--keywords` writes the same events in the
keyword form the broker used before the types, on a checkout from before
issue 46 (whose Journal.emit took keywords): the before/after. No root, no
network:

    python scripts/bench/event_cost.py [--keywords] [N] [ROUNDS]
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from stages.broker.journal import Journal  # noqa: E402
from stages.record.events import Emitter  # noqa: E402

try:
    from stages.record import event_types as ev
except ImportError:         # before issue 46: only --keywords runs
    ev = None


class _Turn:
    """The loop as the Journal sees it: running, its flush called by hand."""

    def __init__(self):
        self.calls = []

    def is_running(self) -> bool:
        return True

    def call_soon(self, callback) -> None:
        self.calls.append(callback)


def _typed(journal: Journal, conn: int) -> None:
    journal.emit(ev.ConnRequest(conn, door="http", kind="http-connect", host="pypi.org", port=443))
    journal.emit(ev.DnsResolve(conn, host="pypi.org", addresses=["151.101.0.223", "151.101.64.223"],
                               ms=3))
    journal.emit(ev.PolicyAllow(conn, rule="allow pypi.org", reason='pypi.org matches allow rule '
                                '"pypi.org" (policy.toml:3)', host="pypi.org", port=443, door="http"))
    journal.emit(ev.ConnOpen(conn, address="151.101.0.223", port=443, via="direct", ms=1))
    journal.emit(ev.ConnClose(conn, bytes_up=812, bytes_down=20417, ms=96))


def _keywords(journal: Journal, conn: int) -> None:
    journal.emit("conn.request", conn, door="http", kind="http-connect", host="pypi.org", port=443)
    journal.emit("dns.resolve", conn, host="pypi.org", addresses=["151.101.0.223", "151.101.64.223"],
                 ms=3)
    journal.emit("policy.allow", conn, rule="allow pypi.org", reason='pypi.org matches allow rule '
                 '"pypi.org" (policy.toml:3)', host="pypi.org", port=443, door="http")
    journal.emit("conn.open", conn, address="151.101.0.223", port=443, via="direct", ms=1)
    journal.emit("conn.close", conn, bytes_up=812, bytes_down=20417, ms=96)


def per_event_us(write, n: int) -> float:
    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        journal = Journal(Emitter(fd, "r-bench", path="direct"), -1)
        turn = journal.loop = _Turn()
        started = time.thread_time()     # CPU time: the machine is shared, its wall clock is not ours
        for conn in range(1, n + 1):
            write(journal, conn)
            for callback in turn.calls:
                callback()
            turn.calls.clear()
        return (time.thread_time() - started) / (5 * n) * 1e6
    finally:
        os.close(fd)


def main(argv: list[str]) -> None:
    write = _keywords if "--keywords" in argv else _typed
    numbers = [int(a) for a in argv if a.isdigit()]
    n, rounds = (numbers + [20000, 15][len(numbers):])[:2]
    per_event_us(write, 1000)          # warm: imports, the emitter's envelope
    runs = [per_event_us(write, n) for _ in range(rounds)]
    print(f"{'keywords' if write is _keywords else 'types'}: {statistics.median(runs):.3f} us/event "
          f"(median of {rounds} x {n} connections; min {min(runs):.3f}, max {max(runs):.3f}; "
          f"load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main(sys.argv[1:])

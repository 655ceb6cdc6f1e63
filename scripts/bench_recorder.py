#!/usr/bin/env python3
"""Benchmark the recorder process: events/s from a pipe into the run file.

A writer process sends N events (connections of 6 events each: request, dns,
allow, open, close, plus one amortised run-level event) as whole lines into a
pipe; a forked recorder (main_from_fds, as the orchestrator runs it) writes
them to a file. Reports events/s, the cost per event and per connection, for
each human mode.

    /opt/vpnw-venv/bin/python scripts/bench_recorder.py [--events N]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stages.record.events import DIGEST_SUFFIX_LEN, encode  # noqa: E402


def connection_lines(n_conns: int) -> list[bytes]:
    lines = []
    t = 1_790_682_276_000_000_000
    for conn in range(1, n_conns + 1):
        host = f"host{conn % 100}.example.com"
        for type_, fields in (
            ("conn.request", {"door": "http", "kind": "http-connect", "host": host, "port": 443}),
            ("dns.resolve", {"host": host, "addresses": ["140.82.112.6"], "ms": 1.2}),
            ("policy.allow", {"rule": "default", "reason": "trace: no policy"}),
            ("conn.open", {"address": "140.82.112.6", "port": 443, "via": "direct", "ms": 0.4}),
            ("conn.close", {"bytes_up": 1234, "bytes_down": 56789, "ms": 12.5}),
        ):
            t += 50_000
            lines.append(encode("r-bench0", type_, fields, path="direct", conn=conn, pid=1, ts_ns=t))
    return lines


def run_once(lines: list[bytes], human: str, record: str) -> float:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        from stages.recorder.main import main_from_fds
        os._exit(main_from_fds(r, record=record, human=human, color=False))
    os.close(r)
    started = time.perf_counter()
    for line in lines:
        os.write(w, line)   # one write per event, as Emitter does
    os.close(w)
    _, status = os.waitpid(pid, 0)
    elapsed = time.perf_counter() - started
    assert os.waitstatus_to_exitcode(status) == 0
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=300_000)
    args = parser.parse_args()
    n_conns = max(1, args.events // 5)
    lines = connection_lines(n_conns)
    n = len(lines)
    size = sum(map(len, lines))
    print(f"{n:,} events ({n_conns:,} connections), {size / 1e6:.1f} MB, avg line {size / n:.0f} B")
    with tempfile.TemporaryDirectory() as tmp:
        for human in ("quiet", "run", "trace"):
            record = os.path.join(tmp, f"{human}.jsonl")
            elapsed = run_once(lines, human, record)
            # Each line gains its digest, ,"d":"<64 hex>" (docs/record.md).
            assert os.path.getsize(record) == size + n * DIGEST_SUFFIX_LEN - n
            per_event = elapsed / n * 1e6
            print(f"human={human:5}: {n / elapsed:10,.0f} events/s  {per_event:5.1f} us/event  "
                  f"{per_event * 6:6.1f} us per connection (6 events)")


if __name__ == "__main__":
    main()

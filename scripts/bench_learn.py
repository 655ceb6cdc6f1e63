#!/usr/bin/env python3
"""Benchmark `vpnw learn`: a 1,000,000-event record in a temp file, learnt.

Reports events/s (reading the file and drafting) and peak memory: the process's
ru_maxrss before and after, and tracemalloc's peak on a second pass.

    /opt/vpnw-venv/bin/python scripts/bench_learn.py [--events N] [--hosts H]
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stages.learner.draft import draft_policy  # noqa: E402
from stages.record.events import encode, read_events  # noqa: E402

T0 = 1_790_682_276_000_000_000


def write_record(path: str, n_events: int, n_hosts: int) -> int:
    """A trace of n_events: run.start, then connections of 6 events each
    (request, dns, allow, open, close... and a deny every 50th), run.end."""
    hosts = [f"host{i}.example{i % 7}.com" for i in range(n_hosts)]
    written = 0
    t = T0
    with open(path, "wb") as f:
        def emit(type_, conn=None, **fields):
            nonlocal written, t
            t += 50_000
            f.write(encode("r-bench0", type_, fields, path="direct", conn=conn, pid=1, ts_ns=t))
            written += 1
        emit("run.start", mode="trace", program="agent", policy=None, policy_file=None, via="direct",
             dry_run=False, allow_unix_sockets=False, version="0.1.0", record=path)
        conn = 0
        while written < n_events - 1:
            conn += 1
            host = hosts[conn % n_hosts]
            emit("conn.request", conn, door="http", kind="http-connect", host=host, port=443)
            emit("dns.resolve", conn, host=host, addresses=["140.82.112.6"], ms=1.2)
            if conn % 50 == 0:
                emit("policy.deny", conn, rule="default", reason="no allow rule matches", enforced=True)
                continue
            emit("policy.allow", conn, rule="default", reason="trace: no policy")
            emit("conn.open", conn, address="140.82.112.6", port=443, via="direct", ms=0.4)
            emit("conn.close", conn, bytes_up=1234, bytes_down=56789, ms=12.5)
        emit("run.end", exit_code=0, connections=conn, denied=conn // 50, would_deny=0, failed=0, ms=1)
    return written


def learn(path: str) -> str:
    with open(path, "rb") as f:
        return draft_policy(read_events(f), "bench")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--hosts", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.jsonl")
        started = time.perf_counter()
        n = write_record(path, args.events, args.hosts)
        size = os.path.getsize(path)
        print(f"record: {n:,} events, {size / 1e6:.1f} MB, written in {time.perf_counter() - started:.1f} s")
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        draft = learn(path)
        elapsed = time.perf_counter() - started
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(f"learn: {elapsed:.2f} s, {n / elapsed:,.0f} events/s, {size / elapsed / 1e6:.1f} MB/s; "
              f"draft {len(draft.splitlines())} lines")
        print(f"ru_maxrss: {rss_before / 1024:.1f} MiB before, {rss_after / 1024:.1f} MiB after")
        tracemalloc.start()
        learn(path)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"tracemalloc peak while learning: {peak / 1e6:.2f} MB")


if __name__ == "__main__":
    main()

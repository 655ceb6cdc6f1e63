#!/usr/bin/env python3
"""Benchmark --syslog: events/s into a real rsyslogd, and what it adds per connection.

1. Throughput. The recorder alone (`python -m stages.recorder`, as vpnw forks
   it) reads N events (connections of 5 events each, between a run.start and
   a run.end) from a file and sends them to an rsyslogd (Debian's, with
   mmjsonparse, writing every parsed message to a file; tests/rsyslog_support.py)
   over each transport and in each format. Timed from the recorder's start to
   the moment rsyslogd has written the last message: events/s end to end, and
   what the copy lost (run.end's syslog_lost).
0. The recorder's CPU time for the same N events with and without --syslog
   (to an rsyslogd that drops what it gets): what --syslog costs vpnw per
   event, off the program's path (the recorder is its own process).
2. Cost per connection. A program in the sandbox makes N short connections
   (CONNECT, one GET, read to the end) and times them itself, under
   `vpnw run --record /dev/null` with and without --syslog; the difference
   of the medians divided by N.

Needs root (it builds the test world, tests/world.py; nothing leaves it):
    /opt/vpnw-venv/bin/python scripts/bench_syslog.py [EVENTS] [CONNS] [ROUNDS]
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from rsyslog_support import Rsyslog  # noqa: E402
from world import World  # noqa: E402

from stages.record.events import encode  # noqa: E402

sys.path.insert(0, HERE)
from bench_record_cost import CLIENT  # noqa: E402


def synthetic_run(n_events: int) -> bytes:
    t = 1_790_682_276_000_000_000
    lines = [encode("r-bench0", "run.start", {"mode": "run", "program": "bench", "policy": None,
                                              "policy_file": None, "via": "direct", "dry_run": False,
                                              "allow_unix_sockets": False, "version": "0.1.0",
                                              "record": "-"}, path="direct", pid=1, ts_ns=t)]
    conn = 0
    while len(lines) < n_events - 1:
        conn += 1
        host = f"host{conn % 100}.example.com"
        for type_, fields in (
            ("conn.request", {"door": "http", "kind": "http-connect", "host": host, "port": 443}),
            ("dns.resolve", {"host": host, "addresses": ["140.82.112.6"], "ms": 1.2}),
            ("policy.allow", {"rule": "default", "reason": "no policy: everything is allowed"}),
            ("conn.open", {"address": "140.82.112.6", "port": 443, "via": "direct", "ms": 0.4}),
            ("conn.close", {"bytes_up": 1234, "bytes_down": 56789, "ms": 12.5}),
        ):
            t += 50_000
            lines.append(encode("r-bench0", type_, fields, path="direct", conn=conn, pid=2, ts_ns=t))
    lines.append(encode("r-bench0", "run.end", {"exit_code": 0, "connections": conn, "denied": 0,
                                                "would_deny": 0, "failed": 0, "ms": 1.0},
                        path="direct", pid=1, ts_ns=t + 1))
    return b"".join(lines)


def recorder_cpu(world: World, events, args: list[str], record) -> float:
    """CPU seconds (user + system) the recorder alone spends on the file."""
    r = world.run(["bash", "-c", f"{world.python} -m stages.recorder --human quiet --record {record} "
                   f"{' '.join(args)} < {events}; times"],
                  env={"PYTHONPATH": os.path.join(HERE, "..")}, timeout=600)
    user, system = r.stdout.strip().splitlines()[-1].split()

    def secs(text):
        minutes, _, rest = text.partition("m")
        return int(minutes) * 60 + float(rest.rstrip("s"))
    return secs(user) + secs(system)


def cpu_per_event(world: World, n_events: int, rounds: int) -> None:
    """What --syslog costs the recorder: its CPU time with and without it."""
    data = synthetic_run(n_events)
    events = world.file("bench-cpu-events.jsonl", data)
    count = data.count(b"\n")
    sink = Rsyslog(world, "bench-cpu", udp_port=21520, tcp_port=21521, discard=True).start()
    setups = [("--record only", []),
              ("+ --syslog unix", ["--syslog", str(sink.socket)]),
              ("+ --syslog udp", ["--syslog", "udp://127.0.0.1:21520"]),
              ("+ --syslog tcp", ["--syslog", "tcp://127.0.0.1:21521"]),
              ("+ --syslog tcp, ocsf", ["--syslog", "tcp://127.0.0.1:21521", "--events-format", "ocsf"]),
              ("+ --syslog tcp, ecs", ["--syslog", "tcp://127.0.0.1:21521", "--events-format", "ecs"])]
    try:
        cpu = {label: [] for label, _ in setups}
        for _ in range(rounds):
            for label, args in setups:
                cpu[label].append(recorder_cpu(world, events, args, world.tmp / "bench-cpu.jsonl"))
    finally:
        sink.stop()
    base = statistics.median(cpu[setups[0][0]])
    print(f"0. the recorder's CPU time for {count} events (5 a connection), {rounds} rounds, medians"
          " (a collector that drops what it gets):")
    for label, _ in setups:
        median = statistics.median(cpu[label])
        print(f"  {label:22s} {median / count * 1e6:6.1f} µs/event  {(median - base) / count * 1e6:+6.1f} "
              f"µs/event, {(median - base) / count * 5e6:+6.1f} µs/connection added by --syslog")


def throughput(world: World, n_events: int) -> None:
    data = synthetic_run(n_events)
    events = world.file("bench-events.jsonl", data)
    count = data.count(b"\n")
    conns = data.count(b'"conn.open"')
    print(f"1. {count} events from the recorder into rsyslogd (parsed, written to a file):")
    for fmt in ("jsonl", "ocsf"):
        for transport in ("unix", "udp", "tcp"):
            rs = Rsyslog(world, f"bench-{fmt}-{transport}", udp_port=21514, tcp_port=21515).start()
            try:
                target = {"unix": str(rs.socket), "udp": "udp://127.0.0.1:21514",
                          "tcp": "tcp://127.0.0.1:21515"}[transport]
                record = world.tmp / f"bench-{fmt}-{transport}.jsonl"
                # ocsf renders connection outcomes only: open and close, 2 per connection.
                expected = count if fmt == "jsonl" else 2 * conns
                started = time.perf_counter()
                r = world.run(["sh", "-c", f"{world.python} -m stages.recorder --human quiet "
                               f"--record {record} --syslog {target} --events-format {fmt} < {events}"],
                              env={"PYTHONPATH": os.path.join(HERE, "..")}, timeout=600)
                sent = time.perf_counter()
                got, last = rs.await_quiet(expected)
                done = last - time.monotonic() + time.perf_counter()
                end = json.loads(record.read_bytes().splitlines()[-1])["fields"]
                print(f"  {fmt:5s} {transport:4s} {got / (done - started):7.0f} messages/s written by rsyslogd"
                      f"  ({count / (sent - started):6.0f} events/s out of the recorder;"
                      f" {got}/{expected} arrived, syslog_lost {end.get('syslog_lost')})"
                      + (f" exit {r.returncode}: {r.stderr[-200:]}" if r.returncode else ""))
            finally:
                rs.stop()


def cost_per_connection(world: World, n: int, rounds: int) -> None:
    # Two rsyslogds: one parses and writes every message (as in the tests),
    # one takes and drops them (what vpnw's side costs, without rsyslog's work
    # on the same two cores).
    rs = Rsyslog(world, "bench-cost", udp_port=21516, tcp_port=21517).start()
    sink = Rsyslog(world, "bench-discard", udp_port=21518, tcp_port=21519, discard=True).start()
    setups = [
        ("run --record /dev/null", []),
        ("+ --syslog unix, parsing", ["--syslog", str(rs.socket)]),
        ("+ --syslog udp, parsing", ["--syslog", "udp://127.0.0.1:21516"]),
        ("+ --syslog tcp, parsing", ["--syslog", "tcp://127.0.0.1:21517"]),
        ("+ --syslog tcp ocsf, parsing", ["--syslog", "tcp://127.0.0.1:21517", "--events-format", "ocsf"]),
        ("+ --syslog unix, dropping", ["--syslog", str(sink.socket)]),
        ("+ --syslog udp, dropping", ["--syslog", "udp://127.0.0.1:21518"]),
        ("+ --syslog tcp, dropping", ["--syslog", "tcp://127.0.0.1:21519"]),
    ]
    try:
        client = world.file("bench_client.py", CLIENT)
        times: dict[str, list[float]] = {label: [] for label, _ in setups}
        for _ in range(rounds):
            for label, args in setups:   # interleaved, so drift hits every setup alike
                r = world.vpnw(["run", "--record", "/dev/null", *args, "--", sys.executable, str(client),
                                str(n)], timeout=600)
                if r.returncode != 0:
                    raise SystemExit(f"{label}: exit {r.returncode}\n{r.stderr}")
                times[label].append(float(r.stdout.strip().splitlines()[-1]))
        base = statistics.median(times[setups[0][0]])
        print(f"2. {n} sequential connections through the HTTP door, {rounds} rounds, medians:")
        for label, _ in setups:
            median = statistics.median(times[label])
            print(f"  {label:30s} {median * 1000:8.1f} ms total  {median / n * 1e6:7.1f} µs/conn"
                  f"  {(median - base) / n * 1e6:+7.1f} µs/conn vs no --syslog")
    finally:
        rs.stop()
        sink.stop()


def main() -> None:
    n_events = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    n_conns = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    world = World()
    world.start()
    try:
        cpu_per_event(world, min(n_events, 20_000), rounds)
        throughput(world, n_events)
        cost_per_connection(world, n_conns, rounds)
    finally:
        world.stop()


if __name__ == "__main__":
    main()

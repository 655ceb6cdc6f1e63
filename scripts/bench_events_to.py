#!/usr/bin/env python3
"""Benchmark: does an --events-to consumer hold the program?

A program inside the sandbox makes N plain GETs, one after another, through
vpnw's HTTP door to a small HTTP server on this machine's loopback (started
here; nothing else is contacted), and reports how long that took (its own
clock). The same run is timed with no --events-to, with a consumer that
never reads (`exec sleep 600`), one that reads nothing for a while and then
everything (`sleep 2; cat`), and one that reads slowly (a line every 2 ms).
For each: the program's time and vpnw's wall time (medians of R runs), and
run.end's events_to_lost. Then SIGTERM to vpnw while a consumer is stuck:
how long until vpnw has exited with a complete record.

    /opt/vpnw-venv/bin/python scripts/bench_events_to.py [--conns N] [--repeat R]
"""
from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

VPNW = os.path.join(os.path.dirname(sys.executable), "vpnw")

CLIENT = r'''
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
started = time.perf_counter()
for _ in range(n):
    with socket.create_connection(("127.0.0.1", 3128)) as s:
        s.sendall(b"GET http://127.0.0.1:%d/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % port)
        while s.recv(65536):
            pass
print(f"{time.perf_counter() - started:.4f}")
'''

SLOW_READER = r'''
import sys, time
for line in sys.stdin.buffer:
    time.sleep(0.002)
'''

CONSUMERS = {
    "none": None,
    "never reads": "exec sleep 600",
    "reads late (sleep 2; cat)": "sleep 2; exec cat > /dev/null",
    "reads slowly (1 line/2 ms)": None,   # filled in main(): python SLOW_READER
}


class _Quiet(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self):
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve() -> int:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def one_run(state: str, client: str, port: int, n: int, consumer: str | None) -> dict:
    for name in os.listdir(os.path.join(state, "vpnw", "runs")) if os.path.isdir(
            os.path.join(state, "vpnw", "runs")) else []:
        os.unlink(os.path.join(state, "vpnw", "runs", name))
    args = [VPNW, "run"] + (["--events-to", consumer] if consumer else []) + \
        ["--", sys.executable, client, str(port), str(n)]
    env = {**os.environ, "XDG_STATE_HOME": state}
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"vpnw exited {done.returncode}: {done.stderr}")
    [run] = os.listdir(os.path.join(state, "vpnw", "runs"))
    with open(os.path.join(state, "vpnw", "runs", run), "rb") as f:
        lines = f.read().splitlines()
    end = json.loads(lines[-1])["fields"]
    return {"program": float(done.stdout.strip()), "wall": wall, "lines": len(lines),
            "lost": end.get("events_to_lost"), "connections": end["connections"]}


def sigterm_latency(state: str, consumer: str) -> tuple[float, int, bool]:
    env = {**os.environ, "XDG_STATE_HOME": state}
    marker = os.path.join(state, "started")
    proc = subprocess.Popen([VPNW, "run", "--events-to", consumer, "--", "sh", "-c",
                             f"touch {marker}; exec sleep 600"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not os.path.exists(marker):
        time.sleep(0.005)
    time.sleep(0.2)
    sent = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    took = time.perf_counter() - sent
    os.unlink(marker)
    runs = os.path.join(state, "vpnw", "runs")
    newest = max((os.path.join(runs, r) for r in os.listdir(runs)), key=os.path.getmtime)
    with open(newest, "rb") as f:
        complete = json.loads(f.read().splitlines()[-1])["type"] == "run.end"
    return took, code, complete


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conns", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-events-to-")
    try:
        client = os.path.join(tmp, "client.py")
        with open(client, "w") as f:
            f.write(CLIENT)
        slow = os.path.join(tmp, "slow_reader.py")
        with open(slow, "w") as f:
            f.write(SLOW_READER)
        CONSUMERS["reads slowly (1 line/2 ms)"] = f"exec {sys.executable} {slow}"
        port = serve()
        state = os.path.join(tmp, "state")
        os.makedirs(state)
        print(f"{args.conns} connections per run (5 events each), {args.repeat} runs per row, medians")
        print(f"{'consumer':28} {'program s':>10} {'vpnw wall s':>12} {'lines':>6} {'lost':>6}")
        for name, consumer in CONSUMERS.items():
            results = [one_run(state, client, port, args.conns, consumer) for _ in range(args.repeat)]
            program = statistics.median(r["program"] for r in results)
            spread = max(r["program"] for r in results) - min(r["program"] for r in results)
            wall = statistics.median(r["wall"] for r in results)
            lost = [r["lost"] for r in results]
            assert all(r["connections"] == args.conns for r in results)
            print(f"{name:28} {program:10.3f} {wall:12.3f} {results[0]['lines']:6d} "
                  f"{'-' if lost[0] is None else statistics.median(lost):>6}   "
                  f"(program min..max {min(r['program'] for r in results):.3f}..{max(r['program'] for r in results):.3f}, spread {spread:.3f})")
        for consumer in ("exec sleep 600", "sleep 600"):
            took = [sigterm_latency(state, consumer) for _ in range(args.repeat)]
            times = sorted(t for t, _, _ in took)
            print(f"SIGTERM with --events-to {consumer!r}: vpnw gone after median {statistics.median(times):.3f} s "
                  f"(max {times[-1]:.3f}); exit {took[0][1]}; record complete in {sum(c for *_, c in took)}/{len(took)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

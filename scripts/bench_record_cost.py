"""Benchmark: what the record costs per connection, through real `vpnw` runs.

A program in the sandbox makes N short connections one after another (CONNECT
through the HTTP door, one GET /whoami, read to the end) and times them
itself, so vpnw's start-up is not counted. The same program runs under:

    run  --record /dev/null      the recorder writes nowhere that costs
    run                          the run file in the state directory
    trace                        plus every human line formatted (to a pipe)
    run --events-to 'cat >/dev/null'   plus a second reader of every event

The cost of the record per connection is the difference of the medians
divided by N. Needs root (it builds the test world, tests/world.py):
    /opt/vpnw-venv/bin/python scripts/bench_record_cost.py [N] [rounds]
"""
from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from world import World  # noqa: E402

CLIENT = r'''
import socket, sys, time
n = int(sys.argv[1])
start = time.perf_counter()
for i in range(n):
    sock = socket.create_connection(("127.0.0.1", 3128))
    sock.sendall(b"CONNECT api.github.com:80 HTTP/1.1\r\nHost: api.github.com:80\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(4096)
    sock.sendall(b"GET /whoami HTTP/1.0\r\nHost: api.github.com\r\n\r\n")
    while sock.recv(65536):
        pass
    sock.close()
print(time.perf_counter() - start)
'''

SETUPS = [
    ("run --record /dev/null", ["run", "--record", "/dev/null"]),
    ("run (state-dir file)", ["run"]),
    ("trace (human lines)", ["trace"]),
    ("run --events-to cat", ["run", "--events-to", "cat > /dev/null"]),
]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    world = World()
    world.start()
    try:
        client = world.file("bench_client.py", CLIENT)
        times: dict[str, list[float]] = {label: [] for label, _ in SETUPS}
        for _ in range(rounds):
            for label, args in SETUPS:  # interleaved, so drift hits every setup alike
                r = world.vpnw([*args, "--", sys.executable, str(client), str(n)], timeout=600)
                if r.returncode != 0:
                    raise SystemExit(f"{label}: exit {r.returncode}\n{r.stderr}")
                times[label].append(float(r.stdout.strip().splitlines()[-1]))
        base = statistics.median(times[SETUPS[0][0]])
        print(f"{n} sequential connections through the HTTP door, {rounds} rounds, medians:")
        for label, _ in SETUPS:
            median = statistics.median(times[label])
            print(f"  {label:32s} {median * 1000:8.1f} ms total  {median / n * 1e6:7.1f} µs/conn"
                  f"  {(median - base) / n * 1e6:+7.1f} µs/conn vs /dev/null")
    finally:
        world.stop()


if __name__ == "__main__":
    main()

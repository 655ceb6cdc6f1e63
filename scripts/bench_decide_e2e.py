#!/usr/bin/env python3
"""What a connection pays for the decision, end to end: the time from a
client's CONNECT to the door's answer (200 or 403), inside the real sandbox
in the test world, under `vpnw run` (no policy) and `vpnw guard` with a policy
that decides on the name alone and one that needs the addresses (deny_private:
a DNS look-up first). Medians and p90 in milliseconds.

    sudo /opt/vpnw-venv/bin/python scripts/bench_decide_e2e.py [--n 200]

Needs root (it builds the test world, tests/world.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from world import World  # noqa: E402

CLIENT = r'''
import json, socket, statistics, sys, time
n = int(sys.argv[1])
out = {}
for target in sys.argv[2:]:
    times, status = [], None
    for _ in range(n):
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", 3128), timeout=30) as s:
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
        times.append((time.perf_counter() - started) * 1000)
        status = head.split(b" ", 2)[1].decode() if head else "closed"
    times.sort()
    out[target] = {"status": status, "p50": round(statistics.median(times), 3),
                   "p90": round(times[int(len(times) * 0.9)], 3)}
print(json.dumps(out))
'''

NAMES_ONLY = 'default = "deny"\ndeny_private = false\nallow = ["api.github.com", "140.82.112.0/20"]\n'
WITH_ADDRESSES = 'default = "deny"\ndeny_private = true\nallow = ["api.github.com", "140.82.112.0/20"]\n'
TARGETS = ["api.github.com:443", "evil.example:443", "140.82.112.6:443", "169.254.169.254:443"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="connections per target and setting")
    args = ap.parse_args()
    world = World().start()
    try:
        client = world.file("bench_client.py", CLIENT)
        settings = [("run, no policy", ["run"])]
        for label, body in (("guard, names decide", NAMES_ONLY), ("guard, deny_private", WITH_ADDRESSES)):
            policy = world.file(f"bench-{len(settings)}.toml", f'version = 1\nname = "bench"\n[policy]\n{body}')
            settings.append((label, ["guard", "--policy", str(policy)]))
        print(f"CONNECT -> answer, ms, {args.n} connections each (p50 / p90)")
        print(f"{'setting':<22}" + "".join(f"{t:>24}" for t in TARGETS))
        for label, argv in settings:
            r = world.vpnw([*argv, "--", sys.executable, str(client), str(args.n), *TARGETS], timeout=600)
            if not r.stdout.strip():
                raise SystemExit(f"{label}: no result (exit {r.returncode}): {r.stderr[-2000:]}")
            result = json.loads(r.stdout.strip().splitlines()[-1])
            cells = [f"{result[t]['status']} {result[t]['p50']:.2f}/{result[t]['p90']:.2f}" for t in TARGETS]
            print(f"{label:<22}" + "".join(f"{c:>24}" for c in cells))
    finally:
        world.stop()


if __name__ == "__main__":
    main()

"""Benchmark: each path's check() and dial() latency (the dial contract, dial.py), through each real exit (medians).

Runs everything in a private network namespace (needs root), like the tests:
    /opt/vpnw-venv/bin/python scripts/bench_paths.py [rounds]
"""
import asyncio
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import exits  # noqa: E402
from stages.broker.dialers import dialer_for  # noqa: E402
from stages.config.paths import DIRECT, PathSpec  # noqa: E402


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    ns = exits.PrivateNetns()
    started = []
    listener = ns.run(socket.create_server, ("127.0.0.1", 0))
    target = listener.getsockname()[1]
    try:
        paths = [("direct", DIRECT)]
        for kind, credentials in [("danted", None), ("microsocks", None), ("microsocks", ("u", "p")),
                                  ("tinyproxy", None), ("tinyproxy", ("u", "p")), ("squid", None)]:
            if exits.missing(kind):
                continue
            exit_ = ns.run(exits.start_exit, kind, ns.run(exits.free_port), *(credentials or (None, None)))
            started.append(exit_)
            label = kind + ("+auth" if credentials else "")
            paths.append((label, PathSpec(name=label, type="proxy", scheme=exit_.scheme, host="127.0.0.1",
                                          port=exit_.port, username=exit_.username, password=exit_.password,
                                          resolves_at_exit=True)))

        async def measure(path):
            dialer = dialer_for(path)       # the broker's own: DirectDialer or ProxyDialer
            checks, dials = [], []
            for _ in range(rounds):
                start = time.perf_counter()
                await dialer.check()
                checks.append(time.perf_counter() - start)
                start = time.perf_counter()
                sock, _ = await dialer.dial("127.0.0.1", target, ("127.0.0.1",))
                dials.append(time.perf_counter() - start)
                sock.close()
                accepted, _ = listener.accept()
                accepted.close()
            return statistics.median(checks), statistics.median(dials)

        print(f"{'path':<18} {'check_path':>12} {'dial_via':>12}   (medians of {rounds})")
        for label, path in paths:
            check, dial = ns.run(asyncio.run, measure(path))
            print(f"{label:<18} {check * 1e3:>9.3f} ms {dial * 1e3:>9.3f} ms")
    finally:
        for exit_ in started:
            exit_.stop()
        listener.close()
        ns.close()


if __name__ == "__main__":
    main()

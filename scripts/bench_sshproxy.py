"""Start-up cost of the ssh relay (stages/inside/ssh_proxy.py), which runs once per ssh
connection inside the sandbox: the interpreter alone, against the relay up to
the point where it would dial the door (a usage error exits right there).

    /opt/vpnw-venv/bin/python scripts/bench_sshproxy.py [ROUNDS]
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time


def median_ms(argv: list[str], rounds: int) -> float:
    walls = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        walls.append((time.perf_counter() - t0) * 1000)
    return statistics.median(walls)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    bare = median_ms([sys.executable, "-I", "-c", "pass"], rounds)
    relay = median_ms([sys.executable, "-I", "-m", "stages.inside.ssh_proxy"], rounds)
    print(f"python -I -c pass            {bare:6.1f} ms")
    print(f"python -I -m stages.inside.ssh_proxy {relay:6.1f} ms  (+{relay - bare:.1f} ms of imports)")


if __name__ == "__main__":
    main()

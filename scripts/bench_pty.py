#!/usr/bin/env python3
"""What the terminal relay costs: keystroke echo latency and a stdout burst,
through `vpnw run` against the same program outside vpnw.

Both go through a pty: the benchmark opens one itself (the "user's
terminal"), starts the program on its slave as controlling terminal, types
into the master and reads the master. Outside vpnw that is one pty; under
vpnw the program has its own pty and vpnw relays between the two.

- echo: the program puts its terminal in raw mode and writes back every byte
  it reads; the benchmark types 1,000 keys one at a time and times each from
  its write to its echo (p50, p99).
- burst: on a key the program writes 100 MB (no newlines) to stdout; the
  time from the key to the last byte read, and MB/s.

    python scripts/bench_pty.py [--vpnw PATH] [--keys 1000] [--mb 100]

The program makes no connection; nothing leaves the machine.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import select
import shutil
import signal
import statistics
import struct
import sys
import termios
import time

PYTHON = "/usr/bin/python3"

ECHO = r'''
import os, sys, tty
tty.setraw(0)
os.write(1, b"READY")
while True:
    b = os.read(0, 1)
    if not b or b == b"\x04":
        break
    os.write(1, b)
'''

BURST = r'''
import os, sys, tty
tty.setraw(0)
n = int(sys.argv[1])
os.write(1, b"READY")
os.read(0, 1)
chunk = b"x" * 65536
left = n
while left:
    left -= os.write(1, chunk[:min(left, len(chunk))])
os.read(0, 1)
'''


def spawn(argv: list[str]) -> tuple[int, int]:
    """argv on a new pty's slave as its controlling terminal; (pid, master)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    pid = os.fork()
    if pid == 0:
        os.close(master)
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        for fd in (0, 1, 2):
            os.dup2(slave, fd)
        if slave > 2:
            os.close(slave)
        os.execvp(argv[0], argv)
    os.close(slave)
    return pid, master


def read_until(master: int, marker: bytes, timeout: float = 60.0) -> bytes:
    data = b""
    end = time.monotonic() + timeout
    while marker not in data:
        left = end - time.monotonic()
        if left <= 0 or not select.select([master], [], [], left)[0]:
            raise TimeoutError(f"no {marker!r}; got {data[-300:]!r}")
        data += os.read(master, 65536)
    return data


def finish(pid: int, master: int) -> None:
    """Let the program end, drain the pty (vpnw's summary), reap."""
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if select.select([master], [], [], 0.2)[0]:
            try:
                if not os.read(master, 65536):
                    break
            except OSError:
                break
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
    else:
        os.kill(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    os.close(master)


def bench_echo(prefix: list[str], keys: int) -> list[float]:
    pid, master = spawn([*prefix, PYTHON, "-c", ECHO])
    read_until(master, b"READY")
    times = []
    alphabet = b"abcdefghijklmnopqrstuvwxyz"
    for i in range(keys):
        key = alphabet[i % 26:i % 26 + 1]
        start = time.perf_counter()
        os.write(master, key)
        got = b""
        while key not in got:
            select.select([master], [], [])
            got += os.read(master, 1024)
        times.append(time.perf_counter() - start)
    os.write(master, b"\x04")
    finish(pid, master)
    return times


def bench_burst(prefix: list[str], size: int) -> float:
    pid, master = spawn([*prefix, PYTHON, "-c", BURST, str(size)])
    read_until(master, b"READY")
    start = time.perf_counter()
    os.write(master, b"g")
    seen = 0
    while seen < size:
        select.select([master], [], [])
        seen += os.read(master, 1 << 20).count(b"x")
    elapsed = time.perf_counter() - start
    os.write(master, b"q")
    finish(pid, master)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vpnw", default=shutil.which("vpnw") or
                        os.path.join(os.path.dirname(sys.executable), "vpnw"))
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="bursts per side (median reported)")
    args = parser.parse_args()
    size = args.mb * 1_000_000
    sides = {"outside": [], "vpnw run": [args.vpnw, "run", "--quiet", "--"]}
    print(f"keystroke echo, {args.keys} keys one at a time (ms):")
    for name, prefix in sides.items():
        t = sorted(bench_echo(prefix, args.keys))
        p50 = statistics.median(t) * 1000
        p99 = t[min(len(t) - 1, int(len(t) * 0.99))] * 1000
        print(f"  {name:9s} p50 {p50:6.3f}  p99 {p99:6.3f}  max {t[-1] * 1000:7.3f}")
    print(f"stdout burst, {args.mb} MB, median of {args.rounds}:")
    for name, prefix in sides.items():
        runs = sorted(bench_burst(prefix, size) for _ in range(args.rounds))
        t = statistics.median(runs)
        print(f"  {name:9s} {t:6.3f} s  {args.mb / t:7.1f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: what the Unix-socket supervisor costs per connect() (issue 26).

Every connect() (and listen()) the program makes goes through the supervisor
(docs/security.md, "Unix sockets by origin"), TCP included; an IP connect
costs it one getsockopt more since issue 47 (SO_NETNS_COOKIE: not a socket
made outside). A program times
N connect()s of its own, each to a listener of its own (accepted and closed
after each connect, in the same thread: a program of one thread, as ab and
curl are), and prints the median and p99 in microseconds:

  tcp   a TCP connect to 127.0.0.1 inside the sandbox (the supervisor lets
        the kernel go on with it: "continue", the program being one thread;
        the first connect to the port is made by the supervisor)
  tcp-nb  the same, non-blocking (as ab, curl, Node and Go connect), until
        the socket is writable
  tcp-mt  the same non-blocking connect from a program of four threads (three
        parked), as Node, Go, tokio and Chromium are: never "continue", the
        supervisor makes the connect on the socket it took
  tcp-mt-b  the same, blocking (a Python program with threads): the
        supervisor hands its turn over and makes the connect
  unix  a Unix stream connect to a socket bound in a temp dir (checked: the
        socket file's device and handle against those recorded at the
        program's listen(), then made by the supervisor)
  unix-nb  the same, non-blocking (as Node, Go and tokio connect)

"cpu": the least, over the rounds, of the CPU time of the whole run (vpnw's processes, the supervisor, the
program, start-up included; `perf stat -e task-clock`, nan without perf)
divided by the connects; less noisy on a loaded machine than the latencies. A row's cpu minus the no-notifier row's is the
notifier's own cost per connect (plus its start-up, spread over N).
"sup": the supervisor's own CPU per connect (its process, with `perf stat
-p` from when its receiving thread has started; the least of the rounds),
which no other process's load muddles.

Rows, interleaved over rounds (p50 and p99: the median of the rounds'):
  outside       the same program, no vpnw
  vpnw, no notifier   `vpnw run --allow-unix-sockets` (no supervisor: the
                filter has no notify rule; every Unix socket reachable)
  vpnw          `vpnw run` (the supervisor answers each connect)

  vpnw @REV     with --against REV (repeatable): the same two rows for
                REV's vpnw, built once under /var/tmp (scripts/bench/against.py),
                interleaved with this tree's, so a load on the machine hits both

The doors' connection rate is the other figure the issue asks for:
`scripts/bench/run --only conns --against REV` against a revision from before
the supervisor.

No network but the sandbox's own loopback. Run as any user (--against
builds REV: root, or a user who may write /var/tmp):
    /opt/vpnw-venv/bin/python scripts/bench_unix.py [rounds] [connects] [--against REV]...
"""
from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

VPNW = os.path.join(os.path.dirname(sys.executable), "vpnw")
PERF = shutil.which("perf")     # linux-perf: the cpu figures

CONNECTOR = r'''
import errno, os, select, socket, sys, tempfile, time
kind, n = sys.argv[1], int(sys.argv[2])
if kind.startswith("tcp"):
    server = socket.socket(); server.bind(("127.0.0.1", 0)); address = server.getsockname()
    family = socket.AF_INET
else:
    path = os.path.join(tempfile.mkdtemp(), "s.sock")
    server = socket.socket(socket.AF_UNIX); server.bind(path); address = path
    family = socket.AF_UNIX
server.listen(1024)
server.setblocking(False)
if kind.startswith("tcp-mt"):  # a program of many threads (Node, Go, tokio): three more, parked
    import threading
    parked = threading.Event()
    for _ in range(3):
        threading.Thread(target=parked.wait, daemon=True).start()
times = []
for _ in range(n):
    s = socket.socket(family)
    if kind in ("tcp-nb", "tcp-mt", "unix-nb"):
        s.setblocking(False)
    start = time.perf_counter_ns()
    if kind in ("tcp-nb", "tcp-mt", "unix-nb"):   # as ab, curl, Node and Go connect: then wait until writable
        if s.connect_ex(address) == errno.EINPROGRESS:
            select.select([], [s], [])
    else:
        s.connect(address)
    times.append(time.perf_counter_ns() - start)
    s.close()
    server.accept()[0].close()     # in this one thread, as ab and curl are one
times.sort()
print(times[len(times) // 2] / 1000, times[int(len(times) * 0.99)] / 1000)
'''

KINDS = ("tcp", "tcp-nb", "tcp-mt", "tcp-mt-b", "unix", "unix-nb")
WAYS = {"outside": None, "vpnw, no notifier": [VPNW, "run", "--allow-unix-sockets"],
        "vpnw": [VPNW, "run"]}


def once(way: list[str] | None, kind: str, n: int, script: str) -> tuple[float, float, float, float]:
    """(p50, p99) as the program timed them, the CPU the whole run took per
    connect (perf stat's task-clock, which follows every process the run
    forks, reaped by whom it may be; NaN without perf), and the supervisor's
    own (its threads from when it serves; NaN without one)."""
    argv = [sys.executable, script, kind, str(n)]
    if way is not None:
        argv = [*way, "--record", os.devnull, "--", "/usr/bin/python3", script, kind, str(n)]
    if PERF:
        argv = [PERF, "stat", "-x", ",", "-e", "task-clock", "--", *argv]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=ENV)
    watch = _watch_supervisor(run) if PERF and way is not None else None
    stdout, stderr = run.communicate(timeout=300)
    supervisor = math.nan
    if watch is not None:
        supervisor = _task_clock_ms(watch.communicate(timeout=60)[1]) * 1000 / n
    cpu = _task_clock_ms(stderr) * 1000 / n if PERF else math.nan    # msec -> us per connect
    if run.returncode != 0:
        raise SystemExit(f"{argv}: exit {run.returncode}\n{stderr}")
    p50, p99 = stdout.split()
    return float(p50), float(p99), cpu, supervisor


# vpnw's state (its ledger, its keys) in a directory of the bench's own,
# removed at the end: a run by hand appends nothing to the user's.
ENV = dict(os.environ)


def _task_clock_ms(perf_stderr: str) -> float:
    for line in perf_stderr.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2] == "task-clock":
            return float(fields[0])
    return math.nan


def _watch_supervisor(run: subprocess.Popen) -> subprocess.Popen | None:
    """`perf stat -p` of the run's supervisor (the one descendant holding a
    seccomp listener), once its receiving thread has started; None if it
    never shows (no notifier: --allow-unix-sockets)."""
    for _ in range(2000):
        if run.poll() is not None:
            return None
        for pid in _descendants(run.pid):
            try:
                holds = any(os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:seccomp notify"
                            for fd in os.listdir(f"/proc/{pid}/fd"))
                threads = len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                continue
            if holds and threads >= 2:
                return subprocess.Popen([PERF, "stat", "-x", ",", "-e", "task-clock", "-p", str(pid)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.005)
    return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def least(values) -> float:
    """The least of the figures that were measured (NaN: not measured)."""
    measured = [v for v in values if not math.isnan(v)]
    return min(measured) if measured else math.nan


def ways_against(revs: list[str]) -> dict:
    """Each REV's vpnw rows, its build reused from /var/tmp."""
    if not revs:
        return {}
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "bench"))
    import against
    repo = os.path.dirname(here)
    ways = {}
    for rev in revs:
        vpnw = against.build(repo, rev)
        ways[f"vpnw, no notifier @{rev}"] = [vpnw, "run", "--allow-unix-sockets"]
        ways[f"vpnw @{rev}"] = [vpnw, "run"]
    return ways


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser(description="the Unix-socket supervisor's cost per connect()")
    ap.add_argument("rounds", nargs="?", type=int, default=5)
    ap.add_argument("connects", nargs="?", type=int, default=2000)
    ap.add_argument("--against", action="append", default=[], metavar="REV")
    opts = ap.parse_args()
    rounds, n = opts.rounds, opts.connects
    WAYS.update(ways_against(opts.against))
    with tempfile.TemporaryDirectory() as tmp:
        ENV["XDG_STATE_HOME"] = os.path.join(tmp, "state")
        script = os.path.join(tmp, "connector.py")
        with open(script, "w") as f:
            f.write(CONNECTOR)
        os.chmod(tmp, 0o755)
        results = {(way, kind): [] for way in WAYS for kind in KINDS}
        for _ in range(rounds):
            for way, args in WAYS.items():
                for kind in KINDS:
                    results[(way, kind)].append(once(args, kind, n, script))
    print(f"per connect(), {n} connects a run, {rounds} interleaved runs: p50 / p99 their "
          f"medians, cpu their least (microseconds; the least CPU holds best under load)")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    print(f"{'':32}" + "".join(f"{kind + ' ' + q:>13}" for kind in KINDS
                               for q in ("p50", "p99", "cpu", "sup")))
    for way in WAYS:
        row = []
        for kind in KINDS:
            runs = results[(way, kind)]
            row += [statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
                    least(r[2] for r in runs), least(r[3] for r in runs)]
        print(f"{way:32}" + "".join(f"{v:>13.1f}" for v in row))


if __name__ == "__main__":
    main()

"""Benchmark: what the pins cost (docs/architecture.md, "Pins").

A start directory holding N repositories (`git init`, each one level down,
with a submodule's git directory in every tenth), and `vpnw run --record
/dev/null -- true` started there, N = 0, 10, 100, 300; interleaved rounds,
medians. From the start-up trace (VPNW_STARTUP_TRACE):
  - protect: vpnw's side, "record opened" -> "protection and environment
    computed" (the scan below the start directory, the look-ups, the
    ancestors' inodes);
  - binds: init's "file limits" -> "protected paths bound read-only" (the
    pins and the read-only binds, in the sandbox's mount namespace);
  - after: "stages reaped" -> "run.end sent" (the inodes compared, the scan
    for new repositories);
  - wall: the whole `vpnw run`.
And how many paths are protected and how many directories pinned for each N.

No network (the program makes none). Run as any user, e.g. inside `unshare -n`:
    /opt/vpnw-venv/bin/python scripts/bench_pins.py [rounds]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

VPNW = os.path.join(os.path.dirname(sys.executable), "vpnw")
SIZES = (0, 10, 100, 300)


def make_repos(top: str, n: int) -> None:
    for i in range(n):
        repo = os.path.join(top, f"r{i}")
        subprocess.run(["git", "init", "-q", repo], check=True)
        if i % 10 == 0:
            os.makedirs(os.path.join(repo, ".git", "modules"), exist_ok=True)
            subprocess.run(["git", "init", "-q", "--separate-git-dir",
                            os.path.join(repo, ".git", "modules", "sub"), os.path.join(repo, "sub")],
                           check=True)


def spans(trace: str) -> dict:
    marks = {}
    with open(trace) as f:
        for line in f:
            ns, _pid, _cpu, stage, what = line.rstrip("\n").split(" ", 4)
            marks.setdefault((stage, what), int(ns))

    def span(a, b):
        return (marks[b] - marks[a]) / 1e6 if a in marks and b in marks else float("nan")
    return {"protect": span(("vpnw", "record opened"), ("vpnw", "protection and environment computed")),
            "binds": span(("init", "file limits"), ("init", "protected paths bound read-only")),
            "after": span(("vpnw", "stages reaped"), ("vpnw", "run.end sent"))}


def counts(top: str) -> tuple[int, int]:
    from stages.config import protected as pr
    from stages.config.lookups import invoker_homes, locate
    from stages.helper.pins import ancestors_to_pin
    from stages.kernel.mounts import mount_points_under
    home, others = invoker_homes(dict(os.environ))
    p = pr.protect(pr.Inputs(homes=(home, *others), cwd=top), locate, pr.read_small, pr.list_small_dir)
    paths = [e.path for e in p.read_only]
    return len(paths), len(ancestors_to_pin(paths, mount_points_under("/")))


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    with tempfile.TemporaryDirectory(prefix="vpnw-bench-pins-") as tmp:
        tops = {}
        for n in SIZES:
            tops[n] = os.path.join(tmp, f"n{n}")
            os.makedirs(tops[n])
            make_repos(tops[n], n)
        results = {n: {"protect": [], "binds": [], "after": [], "wall": []} for n in SIZES}
        for _ in range(rounds):
            for n in SIZES:
                trace = os.path.join(tmp, "trace")
                env = {**os.environ, "VPNW_STARTUP_TRACE": trace}
                start = time.perf_counter()
                subprocess.run([VPNW, "run", "--record", "/dev/null", "--", "true"], cwd=tops[n],
                               env=env, check=True, stderr=subprocess.DEVNULL)
                results[n]["wall"].append((time.perf_counter() - start) * 1000)
                for k, v in spans(trace).items():
                    results[n][k].append(v)
                os.unlink(trace)
        print(f"load average {os.getloadavg()[0]:.2f}; {rounds} rounds; medians in ms")
        print(f"{'repos':>6} {'protected':>9} {'pinned':>6} {'protect':>8} {'binds':>7} {'after':>7} {'wall':>7}")
        for n in SIZES:
            protected, pinned = counts(tops[n])
            m = {k: statistics.median(v) for k, v in results[n].items()}
            print(f"{n:>6} {protected:>9} {pinned:>6} {m['protect']:>8.2f} {m['binds']:>7.2f} "
                  f"{m['after']:>7.2f} {m['wall']:>7.1f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Start-up of each agent under `vpnw run` against the same command outside
vpnw, as far as each starts without an account, in the test world (outside
vpnw too, so every connection either run makes stays in our namespaces).
Medians of N runs after one warm-up each, in seconds, with min and max; the
two sides take turns (outside, inside, outside, ...) so a change in the
machine's load falls on both. The load average is printed with each row.

    sudo /opt/vpnw-venv/bin/python scripts/bench_agents.py [--n 5] [--user vpnwtest] [--only claude,true]

Columns: the wall time outside and under `vpnw run`, what vpnw adds, and
what it adds beyond `true`'s row (vpnw's own start and end, measured in the
same run): the part an agent's own start-up costs more inside, judged
against issue 33's 0.3 s line. Then the CPU seconds of all the run started
(a cgroup of its own: vpnw's stages, orphans and daemons included) on each
side and the same "beyond true", and the seconds its processes were ready
but waited for a CPU (the cgroup's cpu.pressure). CPU is what the machine's
load does not blur: a row over the line in wall but not in CPU is waiting,
on the load (the wait column) or on a timeout, not working. The last
column is what vpnw adds beyond true less the extra time waited for a CPU
(approximate: vpnw's own stages wait for a CPU too, and their wait counts
in the group's). A row is over the 0.3 s line when both it and '>true' are.
The second row, `sleep 1`, is vpnw's own cost too: a run whose program
stays a moment also loads the broker's loop, which `true` ends before.

What is timed (the agents as scripts/setup installs them):
  true                           vpnw's own cost: the floor under every row
  codex/claude/aider --version   process start, nothing else
  Codex CLI, Claude Code         start to their first screen in a terminal
                                 (tmux, polled every 20 ms): "Sign in with
                                 ChatGPT" / "Choose the text style"
  aider --exit                   its whole start: update check, model metadata
  chromium --dump-dom            headless Chromium fetching a page of the world
                                 (the proxy from ALL_PROXY, no flag of vpnw's)
  python agent                   import httpx and aiohttp, GET a page with aiohttp

Needs root (it builds the test world, tests/world.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from agents_support import (AIDER, CHROMIUM, CHROMIUM_FLAGS, CLAUDE, CODEX, CODEX_ARGS,  # noqa: E402
                            PAGE, VPNW, Terminal, prepare_world, restore_world)
from world import World  # noqa: E402

AGENT_HTTP = r'''
import asyncio, sys, aiohttp, httpx
async def get(url):
    async with aiohttp.ClientSession(trust_env=True) as s:
        async with s.get(url) as r:
            return r.status
sys.exit(0 if asyncio.run(get(sys.argv[1])) == 200 else 1)
'''


LINE = 0.3         # issue 33: what an agent's start-up may cost beyond vpnw's own (s)
FLOOR_ROWS = 2     # the first rows of cases(): vpnw's own cost, always measured


class CpuMeter:
    """The CPU of everything one measured run starts, orphans and daemons
    included (outside vpnw Chromium's zygote and renderers leave its process
    tree; inside, the sandbox's init reaps them): a cgroup (v2) of the run's
    own. This process steps into it to start the run, so the run and all it
    forks are born there, and steps back out at once. Also the time the
    run's processes waited for a CPU (the group's cpu.pressure, "some"): the
    part of the wall that is the machine's load. Without a writable cgroup2
    mount the CPU columns read n/a."""

    def __init__(self):
        self.mount = self.home = None
        with open("/proc/mounts") as f:
            mounts = [line.split()[1] for line in f if line.split()[2] == "cgroup2"]
        with open("/proc/self/cgroup") as f:
            own = [line.strip()[3:] for line in f if line.startswith("0::")]
        if mounts and own and os.access(mounts[0], os.W_OK):
            self.mount, self.home = mounts[0], os.path.join(mounts[0], own[0].lstrip("/"))
        self.count = 0

    def enter(self) -> str | None:
        if self.mount is None:
            return None
        self.count += 1
        group = os.path.join(self.mount, f"vpnw-bench-agents-{os.getpid()}-{self.count}")
        os.mkdir(group)
        self._move(group)
        return group

    def leave(self) -> None:
        if self.mount is not None:
            self._move(self.home)

    @staticmethod
    def _move(group: str) -> None:
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write("0")                             # this process

    @staticmethod
    def read(group: str | None) -> tuple[float, float] | tuple[None, None]:
        """(CPU s used in the group so far, s its processes waited for a CPU)."""
        if group is None:
            return None, None
        with open(os.path.join(group, "cpu.stat")) as f:
            usage = next(int(line.split()[1]) for line in f if line.startswith("usage_usec"))
        try:
            with open(os.path.join(group, "cpu.pressure")) as f:
                waited = int(f.readline().rsplit("total=", 1)[1])
        except (OSError, IndexError, ValueError):
            waited = None                            # no PSI on this kernel
        return usage / 1e6, None if waited is None else waited / 1e6

    @staticmethod
    def remove(group: str | None) -> None:
        """Remove the group once its processes are gone (a moment after the
        run ends); one still running (a daemon the agent left) keeps it."""
        if group is None:
            return
        deadline = time.monotonic() + 5
        while True:
            try:
                os.rmdir(group)
                return
            except OSError:
                if time.monotonic() > deadline:
                    print(f"(left {group}: a process the run started is still in it)", file=sys.stderr)
                    return
                time.sleep(0.05)


METER = CpuMeter()


def timed_command(world, user, argv, *, inside, vpnw_args=("run",), env=None, cwd=None):
    """(wall s, CPU s of all it started, s its processes waited for a CPU)."""
    full = [VPNW, *vpnw_args, "--", *argv] if inside else list(argv)
    group = METER.enter()
    try:
        started = time.perf_counter()
        r = world.run([str(a) for a in full], user=user, env={**world.agent_env, **(env or {})},
                      cwd=cwd, timeout=600)
        took = time.perf_counter() - started
    finally:
        METER.leave()
    time.sleep(0.2)                                  # a program's helpers outlive it by a moment
    cpu, waited = METER.read(group)
    METER.remove(group)
    if r.returncode != 0:
        raise RuntimeError(f"{full} -> {r.returncode}: {r.stderr[-2000:]}")
    return took, cpu, waited


def timed_screen(world, user, program, text, *, inside):
    """(wall s to the first screen, CPU s of all it started by then (the
    terminal's tmux server too, on both sides), s they waited for a CPU)."""
    group = METER.enter()
    try:
        started = time.perf_counter()
        term = Terminal(world, program, user=user, env=world.agent_env,
                        vpnw_args=("run",) if inside else ())
    finally:
        METER.leave()
    try:
        while text not in term.screen():
            if term.status() is not None:
                raise RuntimeError(f"{program} ended before showing {text!r}:\n{term.screen()}{term.log()}")
            if time.perf_counter() - started > 300:
                raise RuntimeError(f"{program} never showed {text!r}")
            time.sleep(0.02)
        return (time.perf_counter() - started, *METER.read(group))
    finally:
        term.close()
        METER.remove(group)


def cases(world, user):
    """(name, function(inside) -> (wall s, CPU s, CPU wait s)), for the agents that are installed."""
    # vpnw's own start-up and end, with a program that does nothing: the
    # floor under every row below.
    out = [("true (vpnw's own cost)", lambda inside: timed_command(world, user, ["true"], inside=inside)),
           # vpnw's own cost for a program that stays a moment: what `true`
           # ends before it starts (the broker's loop import, ~45 ms of CPU).
           ("sleep 1 (vpnw, program stays)",
            lambda inside: timed_command(world, user, ["sleep", "1"], inside=inside))]
    for name, path in (("codex --version", CODEX), ("claude --version", CLAUDE), ("aider --version", AIDER)):
        if path.exists():
            out.append((name, lambda inside, p=path: timed_command(world, user, [p, "--version"], inside=inside)))
    if CODEX.exists():
        out.append(("Codex CLI, first screen",
                    lambda inside: timed_screen(world, user, [CODEX, *CODEX_ARGS], "Sign in with ChatGPT",
                                                inside=inside)))
    if CLAUDE.exists():
        out.append(("Claude Code, first screen",
                    lambda inside: timed_screen(world, user, [CLAUDE], "Choose the text style", inside=inside)))
    if AIDER.exists():
        out.append(("aider --exit", lambda inside: timed_command(
            world, user, [AIDER, "--exit", "--no-git", "--no-pretty", "--model", "gpt-4o"], inside=inside,
            env={"OPENAI_API_KEY": "sk-vpnw-bench-no-account"}, cwd=world.workdir(user))))
    if CHROMIUM:
        def chromium(inside):
            profile = world.workdir(user)
            argv = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
            return timed_command(world, user, [*argv, "--dump-dom", PAGE], inside=inside,
                                 env={"HOME": str(profile)})
        out.append(("chromium --dump-dom", chromium))
    prog = world.file("bench_agent_http.py", AGENT_HTTP)
    out.append(("python agent (httpx, aiohttp)", lambda inside: timed_command(
        world, user, [sys.executable, prog, "https://api.github.com/whoami"], inside=inside)))
    return out


def measure(fn, n: int) -> dict:
    """{inside: [(wall, cpu, cpu wait), ...]} after one warm-up per side, the sides interleaved."""
    for inside in (False, True):
        fn(inside)                                   # warm-up: first-run files, page cache
    got = {False: [], True: []}
    for _ in range(n):
        for inside in (False, True):
            got[inside].append(fn(inside))
    return got


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summary(got: dict) -> dict:
    """Medians (and the range of the walls) of one row."""
    walls = {k: sorted(m[0] for m in v) for k, v in got.items()}
    return {"wall": {k: statistics.median(v) for k, v in walls.items()},
            "range": {k: (v[0], v[-1]) for k, v in walls.items()},
            "cpu": {k: _median(m[1] for m in v) for k, v in got.items()},
            "wait": {k: _median(m[2] for m in v) for k, v in got.items()}}


def _num(x, form: str) -> str:
    return "n/a" if x is None else format(x, form)


def row_text(name: str, row: dict, floor: dict | None) -> str:
    wall, cpu, wait = row["wall"], row["cpu"], row["wait"]
    added = wall[True] - wall[False]
    cpu_added = None if None in cpu.values() else cpu[True] - cpu[False]
    beyond = added - floor["added"] if floor else 0.0
    # Less the load's share: the extra time its processes waited for a CPU,
    # beyond what true's run waited (approximate: vpnw's stages wait too).
    unloaded = None if floor is None or None in wait.values() or floor["wait_added"] is None \
        else beyond - ((wait[True] - wait[False]) - floor["wait_added"])
    cpu_beyond = 0.0 if floor is None else (
        None if cpu_added is None or floor["cpu_added"] is None else cpu_added - floor["cpu_added"])
    cells = {k: f"{wall[k]:.3f} ({row['range'][k][0]:.2f}-{row['range'][k][1]:.2f})" for k in wall}
    verdict = ""
    if floor is not None and beyond > LINE:
        # Over only when it is also over less the extra wait for a CPU: on a
        # loaded machine either figure alone is often over by noise.
        verdict = ("  OVER the line" if unloaded is None or unloaded > LINE
                   else "  (over in wall: the wait for a CPU)")
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{name:30} {cells[False]:>20} {cells[True]:>20} {added:>+7.3f} {beyond:>+7.3f}   "
            f"{_num(cpu[False], '.2f'):>6} {_num(cpu[True], '.2f'):>6} {_num(cpu_beyond, '+.3f'):>7}   "
            f"{_num(wait[False], '.2f'):>5} {_num(wait[True], '.2f'):>5} {_num(unloaded, '+.3f'):>7}   "
            f"{load}{verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5, help="timed runs per case and side (after one warm-up)")
    ap.add_argument("--user", default="root", help="run the agents as this user (root or vpnwtest)")
    ap.add_argument("--only", default="", help="comma-separated words: only the cases whose name has one "
                                               "(true's and sleep's rows always run: vpnw's own)")
    args = ap.parse_args()
    only = [w for w in args.only.split(",") if w]
    world = World().start()
    made = prepare_world(world)
    try:
        print(f"{'':30} {'wall s: outside':>20} {'under vpnw run':>20} {'added':>7} {'>true':>7}   "
              f"{'CPU s: out':>6} {'in':>6} {'>true':>7}   {'wait: out':>5} {'in':>5} {'>true-wait':>7}   "
              "load 1/5/15 min",
              flush=True)
        floor = None
        for i, (name, fn) in enumerate(cases(world, args.user)):
            if i >= FLOOR_ROWS and only and not any(w in name for w in only):
                continue
            row = summary(measure(fn, args.n))
            print(row_text(name, row, floor), flush=True)
            if floor is None:                        # true's row: vpnw's own start and end
                floor = {"added": row["wall"][True] - row["wall"][False],
                         "cpu_added": None if None in row["cpu"].values()
                         else row["cpu"][True] - row["cpu"][False],
                         "wait_added": None if None in row["wait"].values()
                         else row["wait"][True] - row["wait"][False]}
        print(f"'>true': what vpnw adds beyond its own start and end; the line is {LINE} s (issue 33). "
              "CPU: all the run started, vpnw's stages included; wait: s its processes were ready "
              "but waited for a CPU (the load's share of the wall); '>true-wait': '>true' less the "
              "extra wait beyond true's; a row is over the line when both are.")
    finally:
        restore_world(world, made)
        world.stop()


if __name__ == "__main__":
    main()

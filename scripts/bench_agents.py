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
against issue 33's 0.3 s line. Then the CPU seconds of the whole process
tree (vpnw's stages included) on each side and the same "beyond true": CPU
is what the machine's load does not blur, so a row whose wall is over the
line but whose CPU is not is waiting (on the load, or on a timeout), not
working.

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
import resource
import statistics
import subprocess
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
_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU seconds of `root` and every process under it, now: each live
    one's own time plus what its reaped children used (cutime, cstime)."""
    stats, children = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue                                  # gone meanwhile
        # after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15)
        stats[int(pid)] = sum(int(x) for x in fields[11:15]) / _TICK
        children.setdefault(int(fields[1]), []).append(int(pid))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


def timed_command(world, user, argv, *, inside, vpnw_args=("run",), env=None, cwd=None):
    """(wall s, CPU s of the whole tree: every process is reaped by the time
    the command returns, so the children's rusage holds all of it)."""
    full = [VPNW, *vpnw_args, "--", *argv] if inside else list(argv)
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    r = world.run([str(a) for a in full], user=user, env={**world.agent_env, **(env or {})},
                  cwd=cwd, timeout=600)
    took = time.perf_counter() - started
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"{full} -> {r.returncode}: {r.stderr[-2000:]}")
    return took, (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)


def timed_screen(world, user, program, text, *, inside):
    """(wall s to the first screen, CPU s of the pane's process tree then)."""
    started = time.perf_counter()
    term = Terminal(world, program, user=user, env=world.agent_env, vpnw_args=("run",) if inside else ())
    try:
        pane = int(subprocess.run([*term.tmux, "display-message", "-p", "#{pane_pid}"],
                                  capture_output=True, text=True, check=True).stdout)
        while text not in term.screen():
            if term.status() is not None:
                raise RuntimeError(f"{program} ended before showing {text!r}:\n{term.screen()}{term.log()}")
            if time.perf_counter() - started > 300:
                raise RuntimeError(f"{program} never showed {text!r}")
            time.sleep(0.02)
        return time.perf_counter() - started, tree_cpu(pane)
    finally:
        term.close()


def cases(world, user):
    """(name, function(inside) -> (wall s, CPU s)), for the agents that are installed."""
    # vpnw's own start-up and end, with a program that does nothing: the
    # floor under every row below.
    out = [("true (vpnw's own cost)", lambda inside: timed_command(world, user, ["true"], inside=inside))]
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
    """{inside: [(wall, cpu), ...]} after one warm-up per side, the sides interleaved."""
    for inside in (False, True):
        fn(inside)                                   # warm-up: first-run files, page cache
    got = {False: [], True: []}
    for _ in range(n):
        for inside in (False, True):
            got[inside].append(fn(inside))
    return got


def summary(got: dict) -> dict:
    """Medians (and the range of the walls) of one row."""
    walls = {k: sorted(w for w, _ in v) for k, v in got.items()}
    return {"wall": {k: statistics.median(v) for k, v in walls.items()},
            "range": {k: (v[0], v[-1]) for k, v in walls.items()},
            "cpu": {k: statistics.median(c for _, c in v) for k, v in got.items()}}


def row_text(name: str, row: dict, floor: dict | None) -> str:
    wall, cpu = row["wall"], row["cpu"]
    added, cpu_added = wall[True] - wall[False], cpu[True] - cpu[False]
    beyond = added - floor["added"] if floor else 0.0
    cpu_beyond = cpu_added - floor["cpu_added"] if floor else 0.0
    cells = {k: f"{wall[k]:.3f} ({row['range'][k][0]:.2f}-{row['range'][k][1]:.2f})" for k in wall}
    verdict = "" if floor is None else ("  OVER the line" if beyond > LINE else "")
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{name:30} {cells[False]:>20} {cells[True]:>20} {added:>+7.3f} {beyond:>+8.3f}   "
            f"{cpu[False]:>6.2f} {cpu[True]:>6.2f} {cpu_beyond:>+7.3f}   {load}{verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5, help="timed runs per case and side (after one warm-up)")
    ap.add_argument("--user", default="root", help="run the agents as this user (root or vpnwtest)")
    ap.add_argument("--only", default="", help="comma-separated words: only the cases whose name has one "
                                               "(true's row always runs: it is the floor)")
    args = ap.parse_args()
    only = [w for w in args.only.split(",") if w]
    world = World().start()
    made = prepare_world(world)
    try:
        print(f"{'':30} {'wall s: outside':>20} {'under vpnw run':>20} {'added':>7} {'>true':>8}   "
              f"{'CPU s: out':>6} {'in':>6} {'>true':>7}   load 1/5/15 min", flush=True)
        floor = None
        for name, fn in cases(world, args.user):
            if floor is not None and only and not any(w in name for w in only):
                continue
            row = summary(measure(fn, args.n))
            print(row_text(name, row, floor), flush=True)
            if floor is None:                        # true's row: vpnw's own start and end
                floor = {"added": row["wall"][True] - row["wall"][False],
                         "cpu_added": row["cpu"][True] - row["cpu"][False]}
        print(f"'>true' is what vpnw adds beyond its own start and end; the line is {LINE} s "
              "(issue 33). CPU is the whole tree's, vpnw's stages included.")
    finally:
        restore_world(world, made)
        world.stop()


if __name__ == "__main__":
    main()

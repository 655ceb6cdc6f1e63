#!/usr/bin/env python3
"""Start-up of each agent under `vpnw run` against the same command outside
vpnw, as far as each starts without an account, in the test world (outside
vpnw too, so every connection either run makes stays in our namespaces).
Medians of N runs after one warm-up each, in seconds, with min and max; the
two sides take turns (outside, inside, outside, ...) so a change in the
machine's load falls on both. The load average is printed with each row.

    sudo /opt/vpnw-venv/bin/python scripts/bench_agents.py [--n 5] [--user vpnwtest] [--only claude,true]

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


def timed_command(world, user, argv, *, inside, vpnw_args=("run",), env=None, cwd=None) -> float:
    full = [VPNW, *vpnw_args, "--", *argv] if inside else list(argv)
    started = time.perf_counter()
    r = world.run([str(a) for a in full], user=user, env={**world.agent_env, **(env or {})},
                  cwd=cwd, timeout=600)
    took = time.perf_counter() - started
    if r.returncode != 0:
        raise RuntimeError(f"{full} -> {r.returncode}: {r.stderr[-2000:]}")
    return took


def timed_screen(world, user, program, text, *, inside) -> float:
    started = time.perf_counter()
    term = Terminal(world, program, user=user, env=world.agent_env, vpnw_args=("run",) if inside else ())
    try:
        while text not in term.screen():
            if term.status() is not None:
                raise RuntimeError(f"{program} ended before showing {text!r}:\n{term.screen()}{term.log()}")
            if time.perf_counter() - started > 300:
                raise RuntimeError(f"{program} never showed {text!r}")
            time.sleep(0.02)
        return time.perf_counter() - started
    finally:
        term.close()


def cases(world, user):
    """(name, function(inside) -> seconds), for the agents that are installed."""
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5, help="timed runs per case and side (after one warm-up)")
    ap.add_argument("--user", default="root", help="run the agents as this user (root or vpnwtest)")
    ap.add_argument("--only", default="", help="comma-separated words: only the cases whose name has one")
    args = ap.parse_args()
    only = [w for w in args.only.split(",") if w]
    world = World().start()
    made = prepare_world(world)
    try:
        print(f"{'case':32} {'outside':>22} {'under vpnw run':>22} {'added':>8}")
        for name, fn in cases(world, args.user):
            if only and not any(w in name for w in only):
                continue
            row = {False: [], True: []}
            for inside in (False, True):
                fn(inside)                                   # warm-up: first-run files, page cache
            for _ in range(args.n):                          # interleaved
                for inside in (False, True):
                    row[inside].append(fn(inside))
            row = {k: sorted(v) for k, v in row.items()}
            med = {k: statistics.median(v) for k, v in row.items()}
            cell = {k: f"{med[k]:.3f} ({row[k][0]:.3f}-{row[k][-1]:.3f})" for k in row}
            load = "/".join(f"{x:.1f}" for x in os.getloadavg())
            print(f"{name:32} {cell[False]:>22} {cell[True]:>22} {med[True] - med[False]:>+8.3f}  load {load}",
                  flush=True)
    finally:
        restore_world(world, made)
        world.stop()


if __name__ == "__main__":
    main()

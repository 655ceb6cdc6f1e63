"""What each start-up trick buys: scripts/bench/tricks.py [--rounds N] [--json]

Each trick of stages/startup/tricks.py is measured here with and without,
each way in a fresh interpreter (this checkout's stages first on the path),
the two ways interleaved round after round: the CPU time
(time.process_time) of the one step the trick changes, after the same
setup. Prints the medians and the gain (without - with) in ms, and the
machine's load average before and after. (The freeze before a fork is
not here: its cost falls in the child, after the fork, and is read from
traced runs, `scripts/bench/run --only startup`.) The table in
stages/startup/tricks.py and docs/architecture.md ("Start-up budget")
carries these figures. No root needed, no network.

    /opt/vpnw-venv/bin/python scripts/bench/tricks.py --rounds 15
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from startup_support import until_the_forks  # noqa: E402  (tests/: the fork harness the tests use)

# name -> (setup, with the trick, without it). The setup runs untimed in
# both; `OFF` in a setup turns the switch off within that process
# (stages.startup.ON is read when each trick runs).
OFF = "import stages.startup; stages.startup.ON = False\n"
RUN_MODULES = ("import stages.orchestrator.run_command, stages.orchestrator.run, "
               "stages.config.policy, stages.config.paths\n")
# vpnw's own start: `vpnw run --record - -- true` until it forks the
# recorder (its second fork), where the CPU so far is printed and it ends
# (tests/startup_support.py; its helper's child ends at once).
UNTIL_THE_RECORDER = until_the_forks(
    "if len(forks) == 2:\n    print((time.process_time() - before) * 1000, flush=True)")
CASES = {
    "pyseccomp's typing and ctypes.util": (
        "import stages.startup.imports as i\n",
        "i.import_pyseccomp()\n",
        "import pyseccomp\n"),
    "socket without selectors": (
        "from stages.startup.stand_ins import stand_in\n",
        "with stand_in('selectors'):\n    import socket\n",
        "import socket\n"),
    "orjson's inspect, copy, platform, datetime": (
        "import stages.startup.imports as i\n",
        "i.import_orjson()\n",
        "import orjson\n"),
    "lean asyncio (its stand-ins)": (
        "import sys, stages.startup.lean_asyncio as la\n",
        "la.import_asyncio(without_ssl=True)\n",
        "sys.modules['ssl'] = None\nimport asyncio\ndel sys.modules['ssl']\n"),
    "asyncio without ssl": (
        "import stages.startup.lean_asyncio as la\n",
        "la.import_asyncio(without_ssl=True)\n",
        "la.import_asyncio(without_ssl=False)\n"),
    "the lookup threads without logging": (
        "import stages.startup.lean_asyncio as la\nla.import_asyncio(without_ssl=True)\n",
        "la.thread_pool_executor()\n",
        "from concurrent.futures import ThreadPoolExecutor\n"),
    "records, not dataclasses and typing": (
        "import stages.startup.records\n",
        RUN_MODULES,
        OFF.replace("\n", "; ") + "import importlib; importlib.reload(stages.startup.records)\n"
        + RUN_MODULES),
    "click not loaded for a clean run": (
        "from stages.orchestrator import options, run_command\n",
        "options.quick_parse('run', ['--', 'true'])\n",
        "from stages.orchestrator import cli\n"
        "ctx = cli.cli.make_context('vpnw', ['run', '--', 'true'])\n"
        "cli.cli.get_command(ctx, 'run').make_context('run', ['--', 'true'], parent=ctx)\n"),
    "no collection while the run's modules load": (
        "import gc\n",
        "gc.disable()\n" + RUN_MODULES + "import stages.startup.imports as i; i.import_orjson()\n"
        "gc.enable()\n",
        RUN_MODULES + "import stages.startup.imports as i; i.import_orjson()\n"),
    "no collection while the loop loads": (
        "import gc\n" + RUN_MODULES,
        "gc.disable()\nimport stages.startup.lean_asyncio as la; la.import_asyncio(True)\n"
        "import stages.broker.loop, stages.broker.decide\ngc.enable()\n",
        "import stages.startup.lean_asyncio as la; la.import_asyncio(True)\n"
        "import stages.broker.loop, stages.broker.decide\n"),
    "no collection while vpnw starts (to the recorder's fork)": (
        "import gc\nfrom stages.orchestrator import main\n",
        UNTIL_THE_RECORDER,
        "gc.disable = gc.freeze = lambda: None\n" + UNTIL_THE_RECORDER),
    "no collection in the helper until Ready (its imports)": (
        "import gc\n",
        "gc.disable()\nimport stages.helper.main, stages.helper.sandbox\ngc.enable()\n",
        "import stages.helper.main, stages.helper.sandbox\n"),
    "_json, not json": ("", "import _json\n", "import json\n"),
    "_ctypes, not ctypes": ("", "import stages.kernel.foreign\n", "import ctypes\n"),
    "_socket before the helper's fork": ("", "import _socket\n", "import socket\n"),
    "_sha256 and _blake2, not hashlib": (
        "", "from _sha256 import sha256\nfrom _blake2 import blake2b\n",
        "from hashlib import sha256, blake2b\n"),
    "_thread, not threading": ("", "import _thread\n", "import threading\n"),
}

PROGRAM = """\
import sys, time
sys.path.insert(0, {root!r})
{setup}
before = time.process_time()
{timed}
print((time.process_time() - before) * 1000)
"""


def once(setup: str, timed: str) -> float:
    code = PROGRAM.format(root=ROOT, setup=setup, timed=timed)
    env = {k: v for k, v in os.environ.items() if k != "VPNW_STARTUP_TRICKS"}
    env["XDG_STATE_HOME"] = os.path.join(os.environ.get("TMPDIR", "/tmp"), "vpnw-bench-tricks")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         env=env, check=True, stdin=subprocess.DEVNULL).stdout
    return float(out.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", help="a part of a case's name")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = {}
    for name, (setup, with_trick, without) in CASES.items():
        if args.only and args.only not in name:
            continue
        on, off = [], []
        for _ in range(args.rounds):
            on.append(once(setup, with_trick))
            off.append(once(setup, without))
        results[name] = {"with_ms": statistics.median(on), "without_ms": statistics.median(off),
                         "gain_ms": statistics.median(off) - statistics.median(on)}
    load = {"before": load_before, "after": os.getloadavg()}
    if args.json:
        print(json.dumps({"load": load, "tricks": results}, indent=1))
        return 0
    print(f"{'trick':52} {'with':>7} {'without':>8} {'gain':>7}  (CPU ms, median of {args.rounds})")
    for name, r in results.items():
        print(f"{name:52} {r['with_ms']:7.2f} {r['without_ms']:8.2f} {r['gain_ms']:7.2f}")
    print("load average before: %.2f %.2f %.2f, after: %.2f %.2f %.2f"
          % (*load["before"], *load["after"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The broker's loop import without the modules asyncio loads but uses only
when something goes wrong (stages/startup/lean_asyncio.py).

Each check runs one script in two fresh interpreters: asyncio imported the
broker's way (the stand-ins) and the plain way (the control). What the
script sees must be the same both ways: errors asyncio logs, a name looked
up through the thread pool, a concurrent future wrapped, a subprocess, a
timeout, a staggered race, the C accelerator's checks and debug stacks. The
broker's way must load none of the stood-in modules until then."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from e2e_support import audited_run
from progs_support import PROGS
from startup_support import needs_the_tricks


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What lean_asyncio stands in for, and what those bring: none is loaded by the loop's import.
OFF_THE_LOOP = {"inspect", "ast", "dis", "logging", "traceback", "linecache", "tokenize",
                "textwrap", "string", "subprocess", "locale", "concurrent.futures",
                "concurrent.futures._base", "typing", "contextlib", "asyncio.sslproto", "ssl"}
# The way asyncio is imported (tests/progs/lean_asyncio_way.py's first argument):
# the broker's, by whether it captures, or the plain import (the control).
BROKERS_WAY = {False: "brokers", True: "brokers-capture"}
PLAIN_WAY = "plain"


def _lines(way: str, checks: str, tmp_path) -> list[str]:
    """What tests/progs/lean_asyncio_way.py with this way and these checks
    (a module beside it) prints, in a fresh interpreter."""
    done = subprocess.run([sys.executable, str(PROGS / "lean_asyncio_way.py"), way, checks,
                           ",".join(sorted(OFF_THE_LOOP))], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _run(way: str, tmp_path) -> dict:
    return json.loads(_lines(way, "lean_asyncio_checks", tmp_path)[-1])


@needs_the_tricks
@pytest.mark.parametrize("capture", [False, True])
def test_the_loop_import_loads_no_stood_in_module_and_every_path_gets_the_real_one(tmp_path, capture):
    brokers = _run(BROKERS_WAY[capture], tmp_path)
    plain = _run(PLAIN_WAY, tmp_path)
    assert brokers.pop("off_the_loop") == []
    # Control: a plain asyncio import loads each of them.
    assert set(plain.pop("off_the_loop")) == OFF_THE_LOOP
    assert brokers == plain
    assert "ZeroDivisionError" in brokers["logged"] and "Exception in callback" in brokers["logged"]
    assert brokers["silenced"] == ""
    assert brokers["logger"] == ["asyncio", 50]
    assert brokers["lookups"][0] == brokers["lookups"][1] == [["127.0.0.1", 80]]
    assert brokers["wrapped"] == 5 and brokers["threadsafe"] == 7
    assert brokers["subprocess"] == ["7\n", 0] and brokers["timed_out"]
    assert brokers["staggered"] == ["first", 0]
    assert brokers["yielded_generator"].startswith("yield was used instead of yield from for generator")
    assert brokers["debug_stack"][0] == "create_future"      # the stand-in adds no frame
    assert brokers["waited"] == 1
    assert brokers["names"] == [True] * 7 + [True]
    assert brokers["real"] == [] and brokers["package"] == [True, True]
    assert [asyncio for asyncio, _inspect in brokers["iscoroutinefunction"]] == \
        [False, True, True, True, False, False, True, False, False, False, False, False]
    assert all(asyncio == inspect for asyncio, inspect in brokers["iscoroutinefunction"])



@needs_the_tricks
def test_the_loop_starts_stops_and_looks_up_without_them_and_logs_once_logging_is_set_up(tmp_path):
    """The broker's loop as it starts (a new loop, which logs its selector
    at debug; add_signal_handler, which asks whether its callback is a
    coroutine function) loads none of them either, and its first name
    lookup through the thread pool loads concurrent.futures alone, whose
    logger still logs a callback that raises (to stderr, through logging,
    loaded then). Control: once logging is loaded and set to debug, the
    loop's debug line is there."""
    lines = _lines(BROKERS_WAY[False], "lean_asyncio_loop_starts", tmp_path)
    assert lines[0] == "[]"
    assert lines[1] == "[('127.0.0.1', 80)]"
    assert lines[2] == "['concurrent.futures', 'concurrent.futures._base']"
    assert lines[3].startswith("['exception calling callback for <Future at") and lines[3].endswith(" True")
    assert "DEBUG:asyncio:Using selector: EpollSelector" in lines[4:]


@pytest.mark.world
@needs_the_tricks
def test_a_real_brokers_loop_loads_without_the_stood_in_modules(world, user):
    """A real run (every import of every process seen) whose broker loads
    and starts its loop: from "loop import begun" to its end, the broker
    imports none of the stood-in modules, nor what they bring. Control:
    asyncio and the broker's loop are imported in that stretch."""
    work = world.workdir(user)
    at, imported = audited_run(world, user, work, ["run", "--record", str(work / "run.jsonl"), "--",
                                                   "sleep", "1"])
    begun, broker = at[("broker", "loop import begun")]
    assert ("broker", "loop loaded") in at
    during = {name for ns, pid, name in imported if pid == broker and begun <= ns}
    assert {"asyncio", "asyncio.base_events", "stages.broker.loop"} <= during      # control
    # ssl is asked for (the audit sees the attempt) and refused: main.py's _load_the_loop.
    assert during & OFF_THE_LOOP == {"ssl"}

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
from startup_support import needs_the_tricks


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What lean_asyncio stands in for, and what those bring: none is loaded by the loop's import.
OFF_THE_LOOP = {"inspect", "ast", "dis", "logging", "traceback", "linecache", "tokenize",
                "textwrap", "string", "subprocess", "locale", "concurrent.futures",
                "concurrent.futures._base", "typing", "contextlib", "asyncio.sslproto", "ssl"}

# One line each: the traceback lines asyncio logs are compared, line numbers too.
BROKERS_WAY = "from stages.broker.main import _load_the_loop; _load_the_loop(capture={capture}); import asyncio"
PLAIN_WAY = "import asyncio"

# vpnw's own modules at the broker's fork (what the broker inherits), then the way, then:
SCRIPT = """
import sys
from stages.orchestrator import main, run_command
from stages.record import events
from stages.wire import status
before = set(sys.modules)
{way}
loaded = sorted(set(sys.modules) - before)
{checks}
"""

CHECKS = r'''
import io, json, socket, threading
out = {"off_the_loop": sorted(set(loaded) & OFF_THE_LOOP)}

def boom():
    1 / 0

async def logged():
    captured, sys.stderr = sys.stderr, io.StringIO()
    try:
        asyncio.get_running_loop().call_soon(boom)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    finally:
        captured, sys.stderr = sys.stderr, captured
    return captured.getvalue()

class YieldsAGenerator:
    def __await__(self):
        yield (x for x in ())

async def bad():
    await YieldsAGenerator()

async def checks():
    loop = asyncio.get_running_loop()
    out["logged"] = await logged()
    import logging
    asyncio.log.logger.setLevel(logging.CRITICAL)
    out["logger"] = [asyncio.log.logger.name, logging.getLogger("asyncio").level]
    out["silenced"] = await logged()
    asyncio.log.logger.setLevel(logging.NOTSET)
    infos = await loop.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)
    from stages.broker.connector import LookupThreads
    threads = await LookupThreads().getaddrinfo("127.0.0.1", 80)
    out["lookups"] = [sorted(i[4] for i in infos), sorted(i[4] for i in threads)]
    import concurrent.futures
    future = concurrent.futures.Future()
    threading.Timer(0.01, future.set_result, (5,)).start()
    out["wrapped"] = await asyncio.wrap_future(future)
    out["threadsafe"] = await loop.run_in_executor(
        None, lambda: asyncio.run_coroutine_threadsafe(asyncio.sleep(0, 7), loop).result(5))
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", "print(7)",
                                                   stdout=asyncio.subprocess.PIPE)
    out["subprocess"] = [(await process.communicate())[0].decode(), await process.wait()]
    try:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(5)
    except TimeoutError:
        out["timed_out"] = True
    async def first():
        return "first"
    out["staggered"] = (await asyncio.staggered.staggered_race([first], 0.1))[:2]
    try:
        await asyncio.create_task(bad())
    except RuntimeError as error:
        out["yielded_generator"] = str(error).split(" in task")[0]
    loop.set_debug(True)
    made = loop.create_future()
    out["debug_stack"] = [made._source_traceback[-1].name, made._source_traceback[-1].lineno]
    loop.set_debug(False)
    done, _ = await asyncio.wait([asyncio.create_task(asyncio.sleep(0))], return_when=asyncio.FIRST_COMPLETED)
    out["waited"] = len(done)

asyncio.run(checks())
import subprocess, typing, contextlib, inspect, traceback, linecache, logging, concurrent.futures
out["names"] = [asyncio.subprocess.PIPE == subprocess.PIPE, asyncio.subprocess.STDOUT == subprocess.STDOUT,
                asyncio.subprocess.DEVNULL == subprocess.DEVNULL,
                asyncio.FIRST_COMPLETED == concurrent.futures.FIRST_COMPLETED,
                asyncio.FIRST_EXCEPTION == concurrent.futures.FIRST_EXCEPTION,
                asyncio.ALL_COMPLETED == concurrent.futures.ALL_COMPLETED,
                asyncio.futures.STACK_DEBUG == logging.DEBUG - 1,
                getattr(asyncio.Timeout, "__final__", None)]
# Every module is the real one now, and the packages hold them.
out["real"] = sorted(name for name in OFF_THE_LOOP - {"ssl"}
                     if name in sys.modules and getattr(sys.modules[name], "__spec__", None) is None)
import functools
async def a_coroutine_function():
    pass
class Callable:
    def __call__(self):
        pass
    async def method(self):
        pass
out["iscoroutinefunction"] = [
    [asyncio.coroutines.iscoroutinefunction(x), inspect.iscoroutinefunction(x)]
    for x in (boom, a_coroutine_function, Callable().method, Callable.method, Callable(), Callable,
              functools.partial(a_coroutine_function), asyncio.Event().set, len, lambda: 0,
              print, YieldsAGenerator().__await__)]
from concurrent import futures
out["package"] = [concurrent.futures is sys.modules["concurrent.futures"],
                  futures is sys.modules["concurrent.futures"]]
print(json.dumps(out))
'''


def _lines(way: str, checks: str, tmp_path) -> list[str]:
    """What SCRIPT with this way and these checks prints, in a fresh interpreter."""
    script = SCRIPT.format(way=way, checks=f"OFF_THE_LOOP = set({sorted(OFF_THE_LOOP)!r})\n" + checks)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _run(way: str, tmp_path) -> dict:
    return json.loads(_lines(way, CHECKS, tmp_path)[-1])


@needs_the_tricks
@pytest.mark.parametrize("capture", [False, True])
def test_the_loop_import_loads_no_stood_in_module_and_every_path_gets_the_real_one(tmp_path, capture):
    brokers = _run(BROKERS_WAY.format(capture=capture), tmp_path)
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


LOOP_STARTS = r'''
import asyncio, io, signal, sys
async def main():
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    asyncio.get_running_loop().call_later(0.01, stopping.set)
    await stopping.wait()
asyncio.run(main())
print(sorted(set(sys.modules) & OFF_THE_LOOP))
from stages.broker.connector import LookupThreads
async def look_up():
    return await LookupThreads().getaddrinfo("127.0.0.1", 80)
print(sorted({info[4] for info in asyncio.run(look_up())}))
print(sorted(set(sys.modules) & OFF_THE_LOOP))
import concurrent.futures
future = concurrent.futures.Future()
def raises(_future):
    raise ValueError("from a callback")
future.add_done_callback(raises)
captured, sys.stderr = sys.stderr, io.StringIO()
future.set_result(1)
captured, sys.stderr = sys.stderr, captured
print(repr(captured.getvalue().splitlines()[:1]), "ValueError: from a callback" in captured.getvalue())
import logging
logging.basicConfig(level=logging.DEBUG, stream=sys.stdout)
asyncio.run(main())
'''


@needs_the_tricks
def test_the_loop_starts_stops_and_looks_up_without_them_and_logs_once_logging_is_set_up(tmp_path):
    """The broker's loop as it starts (a new loop, which logs its selector
    at debug; add_signal_handler, which asks whether its callback is a
    coroutine function) loads none of them either, and its first name
    lookup through the thread pool loads concurrent.futures alone, whose
    logger still logs a callback that raises (to stderr, through logging,
    loaded then). Control: once logging is loaded and set to debug, the
    loop's debug line is there."""
    lines = _lines(BROKERS_WAY.format(capture=False), LOOP_STARTS, tmp_path)
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

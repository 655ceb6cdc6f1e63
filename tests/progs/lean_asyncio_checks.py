"""Run by tests/test_lean_asyncio.py through lean_asyncio_way.py, after
asyncio was imported one way or the other: what the script sees must be
the same both ways (the last line, JSON)."""
# ruff: noqa: E402 (when each module loads is what the test looks at)
from __main__ import OFF_THE_LOOP, loaded
import asyncio
import io
import json
import socket
import sys
import threading
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
for name in ("subprocess", "typing", "contextlib", "inspect", "traceback", "linecache", "logging",
             "concurrent.futures"):
    __import__(name)     # each loaded now: "real" below sees which is still a stand-in
import concurrent.futures
import inspect
import logging
import subprocess
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

"""Run by tests/test_lean_asyncio.py through lean_asyncio_way.py, after
asyncio was imported one way or the other: the broker's loop as it starts,
looks up a name and logs."""
# ruff: noqa: E402 (when each module loads is what the test looks at)
from __main__ import OFF_THE_LOOP
import asyncio
import io
import signal
import sys
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

"""Run by tests/test_broker_early.py. In a fresh interpreter, as in a forked
broker that has not loaded its loop: the direct path's import, then a real
connection served by asyncio."""
# ruff: noqa: E402 (when each module loads is what the test looks at)
import sys
assert "ssl" not in sys.modules and "asyncio" not in sys.modules
from stages.broker.main import _load_the_loop
_load_the_loop(capture=sys.argv[1] == "capture")
print("ssl loaded:", "ssl" in sys.modules, "_ssl loaded:", "_ssl" in sys.modules)
import asyncio
import asyncio.base_events
import asyncio.selector_events
# (asyncio.sslproto, TLS's protocol, is a stand-in while asyncio loads: lean_asyncio.py)
print("asyncio sees ssl:", asyncio.base_events.ssl is not None or asyncio.selector_events.ssl is not None
      or getattr(sys.modules.get("asyncio.sslproto"), "ssl", None) is not None)

async def main():
    async def echo(reader, writer):
        writer.write(await reader.readexactly(5))
        await writer.drain()
        writer.close()
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname())
    writer.write(b"hello")
    print("echo:", (await reader.readexactly(5)).decode())
    writer.close()
    server.close()
asyncio.run(main())
import ssl                      # refused only while the loop loaded
print("ssl afterwards:", ssl.OPENSSL_VERSION.split()[0])

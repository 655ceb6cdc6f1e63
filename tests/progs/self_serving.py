"""Run by tests/test_e2e_unix.py."""
import asyncio
import os
import tempfile

scratch = tempfile.TemporaryDirectory()      # removed as the program ends

async def main():
    path = os.path.join(scratch.name, "server.sock")

    async def answer(reader, writer):
        writer.write(b"echo " + await reader.readline())
        await writer.drain()
        writer.close()
    server = await asyncio.start_unix_server(answer, path)
    async with server:
        got = []
        for n in range(20):
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(f"{n}\n".encode())
            got.append(await reader.readline())
            writer.close()
    assert got == [f"echo {n}\n".encode() for n in range(20)], got
    print("served 20 over", path)

asyncio.run(main())

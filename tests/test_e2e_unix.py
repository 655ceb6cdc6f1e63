"""Unix sockets among the program's own processes, end to end (issue 26), as
root and as the unprivileged user: a person's tmux inside vpnw, in a real
terminal (with the same session outside as the control), and a program that
serves itself over a Unix socket in a temp directory (asyncio, as test
suites and language servers do). The record holds no refusal for either.
Every way at a socket bound outside: tests/bypass/test_unix_origin.py.
"""
from __future__ import annotations

import shutil

import pytest

from e2e_support import describe, run_events
from tmux_support import world_shell

pytestmark = pytest.mark.world

SELF_SERVING = r'''
import asyncio, os, sys, tempfile

async def main():
    path = os.path.join(tempfile.mkdtemp(), "server.sock")

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
'''


def test_a_program_serves_itself_over_a_unix_socket(world, user):
    script = world.file("self_serving.py", SELF_SERVING)
    r = world.vpnw(["run", "--", "/usr/bin/python3", str(script)], user=user, timeout=120)
    assert r.returncode == 0, describe(r)
    assert "served 20 over /tmp/" in r.stdout
    events = run_events(r)
    assert not [e for e in events if e["type"].startswith("unix.")]
    assert next(e for e in events if e["type"] == "sandbox.ready")["fields"]["unix"] == "own"


@pytest.fixture
def term(world, user, tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is missing (scripts/setup installs it)")
    screen = world_shell(world, user, tmp_path)
    try:
        yield screen
    finally:
        screen.close()


@pytest.mark.parametrize("where", ["vpnw", "outside"])
def test_tmux_runs_inside_vpnw(world, term, where):
    """tmux's client and server talk over a socket in the work directory: the
    session draws, takes keys, and ends when its shell does."""
    sock = term.work / f"inner-{where}.sock"
    prefix = f"{term.vpnw} run -- " if where == "vpnw" else ""
    term.line(f"{prefix}tmux -f /dev/null -S {sock} new-session -s inner "
              "'bash --norc --noprofile -i'; echo \"status=$?\"")
    term.wait_for(r"\[inner\]")                   # the inner tmux's status line
    term.line("echo inner-$((6*7))")
    term.wait_for(r"^inner-42$")
    term.line("exit")
    term.wait_for(r"^\[exited\]$")
    term.wait_for(r"^status=0$", whole=True)

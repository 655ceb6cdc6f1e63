"""Nothing is lost: whatever way a run ends, its record is complete and valid.

A program that exits, one killed by SIGKILL, vpnw itself interrupted (SIGINT,
SIGTERM), a program that leaves a daemon behind holding a connection, and
1,000 connections at once through both doors: each run file passes
`check_run`, ends with `run.end` and its exit code. And when the recorder
dies, vpnw stops the program rather than run it unrecorded (exit 125), and
what it had written parses line by line.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from e2e_support import assert_every_connection_accounted, complete_record, describe
from progs_support import prog_text
from stages.record.check import schema_problems

pytestmark = pytest.mark.world

EXIT_INTERNAL = 125


def only_run_file(state_home: Path) -> Path:
    files = sorted((state_home / "vpnw" / "runs").glob("*.jsonl"))
    assert len(files) == 1, files
    return files[0]


def run_end(events: list[dict]) -> dict:
    return events[-1]["fields"]


def program_exit(events: list[dict]) -> dict:
    exits = [e["fields"] for e in events if e["type"] == "program.exit"]
    assert len(exits) == 1, exits
    return exits[0]


# ── a program that ends by itself ───────────────────────────────────────

def test_program_exits_normally(world, user):
    r = world.vpnw(["run", "--", "curl", "-sS", "--max-time", "30", "-o", "/dev/null",
                    "http://api.github.com/whoami"], user=user)
    assert r.returncode == 0, describe(r)
    events = complete_record(only_run_file(r.state_home).read_bytes())
    assert run_end(events)["exit_code"] == 0 and run_end(events)["connections"] == 1
    assert program_exit(events) == {"code": 0, "signal": None}


def test_program_killed_by_sigkill(world, user):
    r = world.vpnw(["run", "--", "sh", "-c",
                    "curl -sS --max-time 30 -o /dev/null http://api.github.com/whoami; kill -KILL $$"],
                   user=user)
    assert r.returncode == 137, describe(r)
    events = complete_record(only_run_file(r.state_home).read_bytes())
    assert run_end(events)["exit_code"] == 137 and run_end(events)["connections"] == 1
    assert program_exit(events)["signal"] == signal.SIGKILL


# ── vpnw itself is told to stop ─────────────────────────────────────────

# Opens a connection (so the record has one in flight), says "ready", waits for
# a signal. With "handle" it writes which signal it got to the marker file and
# exits 42; with "default" it only notes that it got there, then dies by it.
SIGNALLED_PROGRAM = prog_text("signalled_program.py")


@pytest.mark.parametrize("how", ["default", "handle"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_vpnw_signalled_forwards_and_records(world, user, sig, how):
    program = world.file("signalled.py", SIGNALLED_PROGRAM)
    workdir = world.workdir(user)
    marker = workdir / "marker"
    proc = world.popen([str(world.vpnw_path), "run", "--", sys.executable, str(program), str(marker), how],
                       user=user,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # world.popen runs nsenter/setpriv/env, which all exec: proc.pid is vpnw.
    line = proc.stdout.readline()
    assert line == b"ready\n", (line, proc.stdout.read(), proc.stderr.read())
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    text = err.decode("utf-8", "replace")
    assert marker.read_text() == f"got {sig.name}\n", text
    events = complete_record(only_run_file(proc.state_home).read_bytes())
    # The program's own answer decides: it handled the signal and chose 42, or it died by it.
    want = 42 if how == "handle" else 128 + sig
    assert proc.returncode == want, text
    assert run_end(events)["exit_code"] == want
    assert (program_exit(events) == {"code": 42, "signal": None} if how == "handle"
            else program_exit(events)["signal"] == sig)
    assert run_end(events)["connections"] == 1
    assert [e["type"] for e in events].count("conn.close") == 1


# ── a program that leaves children behind ───────────────────────────────

# The parent forks a daemon (new session, stdio closed) that opens a proxied
# connection and then execs `sleep` with that socket still open; the parent
# waits until the connection is up and exits 0. The daemon's sleep carries a
# unique argument so the test can look for it afterwards.
DAEMON_PROGRAM = prog_text("daemon_program.py")


def processes_with(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except OSError:
            continue
        if token.encode() in cmdline.split(b"\0"):
            found.append(int(entry))
    return found


def test_children_left_behind_are_gone_and_their_connections_closed(world, user):
    # A number `sleep` accepts (it sums its arguments) that no other process carries.
    token = f"0.{uuid.uuid4().int % 10**12:012d}"
    program = world.file("daemonizer.py", DAEMON_PROGRAM)
    # Control: a daemon started the same way outside the sandbox does survive
    # its parent, and processes_with finds it.
    control = f"0.{uuid.uuid4().int % 10**12:012d}"
    world.run(["sh", "-c", f"setsid sleep 3600 {control} </dev/null >/dev/null 2>&1 &"], user=user, check=True)
    for _ in range(200):  # the shell returns before its background child has exec'd sleep
        survivors = processes_with(control)
        if survivors:
            break
        time.sleep(0.05)
    assert len(survivors) == 1
    os.kill(survivors[0], signal.SIGKILL)
    r = world.vpnw(["trace", "--", sys.executable, str(program), token], user=user, timeout=60)
    assert r.returncode == 0, describe(r)
    assert "daemon holds its connection" in r.stdout
    # The world has no pid namespace of its own: its /proc is ours, and no
    # process of the sandbox may be left.
    assert processes_with(token) == []
    events = complete_record(only_run_file(r.state_home).read_bytes())
    by_conn = assert_every_connection_accounted(events)
    assert len(by_conn) == 1
    assert [e["type"] for e in events].count("conn.close") == 1
    assert run_end(events)["exit_code"] == 0


# ── 1,000 connections at once ───────────────────────────────────────────

# Opens N connections through each door at once (all held open together), then
# on each sends one GET carrying the tag and reads the answer; prints counts.
MANY_PROGRAM = prog_text("many_connections.py")


@pytest.mark.slow
def test_a_thousand_connections_at_once_through_both_doors(world, user):
    per_door = 500
    tag = uuid.uuid4().hex[:12]
    program = world.file("many.py", MANY_PROGRAM)
    before = len(world.web_log())
    # A usual soft limit of 1024 for vpnw and the program: the broker raises its
    # own to the hard limit at start, the program does the same for itself.
    r = world.run(["sh", "-c", 'ulimit -S -n 1024 && exec "$@"', "sh",
                   str(world.vpnw_path), "run", "--", sys.executable, str(program), str(per_door), tag],
                  user=user, timeout=300)
    assert r.returncode == 0, describe(r)
    assert f"opened {2 * per_door} ok {2 * per_door} errors 0" in r.stdout, describe(r)
    events = complete_record(only_run_file(r.state_home).read_bytes())
    by_conn = assert_every_connection_accounted(events)
    assert len(by_conn) == 2 * per_door
    types = [e["type"] for e in events]
    assert types.count("conn.request") == types.count("conn.open") == types.count("conn.close") == 2 * per_door
    doors = [e["fields"]["door"] for e in events if e["type"] == "conn.request"]
    assert doors.count("http") == doors.count("socks") == per_door
    end = run_end(events)
    assert end["connections"] == 2 * per_door and end["failed"] == 0 and end["denied"] == 0
    served = [line for line in world.web_log()[before:] if f"tag={tag}-" in line]
    assert len(served) == 2 * per_door


# ── the recorder dies mid-run ───────────────────────────────────────────

def recorder_of(vpnw_pid: int) -> int:
    """The recorder among vpnw's children: the broker holds sockets (the
    handoff link) and the helper is in a network namespace of its own; the
    recorder has neither."""
    children = []
    for task in os.listdir(f"/proc/{vpnw_pid}/task"):
        with open(f"/proc/{vpnw_pid}/task/{task}/children") as handle:
            children += [int(pid) for pid in handle.read().split()]
    own_net = os.readlink(f"/proc/{vpnw_pid}/ns/net")
    recorders = []
    for pid in children:
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        if os.readlink(f"/proc/{pid}/ns/net") == own_net and not any(fd.startswith("socket:") for fd in fds):
            recorders.append(pid)
    assert len(recorders) == 1, (children, recorders)
    return recorders[0]


SLEEPER_PROGRAM = prog_text("sleeper.py")


def _beats(marker) -> int:
    try:
        return marker.read_text().count("alive\n")
    except FileNotFoundError:
        return 0


def test_recorder_killed_stops_the_program(world, user):
    program = world.file("sleeper.py", SLEEPER_PROGRAM)
    marker = world.workdir(user) / "marker"
    proc = world.popen([str(world.vpnw_path), "trace", "--", sys.executable, str(program), str(marker)],
                       user=user,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    record = only_run_file(proc.state_home)
    # Wait until the recorder has written the open connection: then it is mid-run.
    while b'"conn.open"' not in record.read_bytes():
        assert proc.poll() is None
        time.sleep(0.05)
    # The control: the heartbeat grows while the program lives.
    beats = _beats(marker)
    while _beats(marker) <= beats + 2:
        assert proc.poll() is None
        time.sleep(0.05)
    os.kill(recorder_of(proc.pid), signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    text = err.decode("utf-8", "replace")
    assert proc.returncode == EXIT_INTERNAL, text
    assert "unrecorded" in text, text
    # Stopped with vpnw: no heartbeat after it ended (ten beats' time).
    ended = _beats(marker)
    time.sleep(0.5)
    assert _beats(marker) == ended, "the program ran on unrecorded"
    data = record.read_bytes()
    assert data.endswith(b"\n")
    events = [json.loads(line) for line in data.split(b"\n")[:-1]]
    for event in events:
        assert schema_problems(event) == [], event
    types = [e["type"] for e in events]
    assert types[0] == "run.start" and "conn.open" in types and "run.end" not in types


# ── vpnw interrupted before the program starts ──────────────────────────

# A "proxy" that accepts and never answers: vpnw's path check waits on it.
SILENT_EXIT = prog_text("silent_exit.py")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_vpnw_signalled_during_the_path_check(world, user, sig):
    silent = world.popen([sys.executable, "-c", SILENT_EXIT], stdout=subprocess.PIPE)
    try:
        port = int(silent.stdout.readline())
        config = world.file(f"silent-{port}.toml", f'version = 1\nname = "silent"\n'
                            f'[paths.silent]\ntype = "proxy"\nurl = "socks5h://127.0.0.1:{port}"\n')
        marker = world.workdir(user) / "marker"
        proc = world.popen([str(world.vpnw_path), "run", "--config", str(config), "--via", "silent",
                            "--", "touch", str(marker)], user=user,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # The broker's path check has reached the exit: the program waits for its answer.
        assert silent.stdout.readline() == b"accepted\n"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        silent.kill()
        silent.wait()
    text = err.decode("utf-8", "replace")
    # Like a shell: 128 + the signal, and the program never ran.
    assert proc.returncode == 128 + sig, text
    assert "not run" in text, text
    assert not marker.exists()
    events = complete_record(only_run_file(proc.state_home).read_bytes())
    assert run_end(events)["exit_code"] == 128 + sig and "interrupted" in run_end(events)["error"]
    assert "program.exit" not in [e["type"] for e in events]

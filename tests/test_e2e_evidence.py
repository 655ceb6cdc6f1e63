"""The record is evidence (issue 12), through real runs, as root and as vpnwtest.

- Fail closed on the record: a record that cannot be opened stops the run
  before the program starts (125, the file and the fix named, the program
  provably not run); one that fails mid-run (a full disk, the reader of
  `--record -` gone) stops the program, 125, whole lines only.
- Side outputs never hold the program: an `--events-to` consumer that never
  reads, or reads late, loses events from its copy (counted in run.end and
  the summary), never from the record; SIGTERM with a stuck consumer ends
  the run at once with a complete record.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_support import describe
from stages.recorder.check import check_run, schema_problems

pytestmark = pytest.mark.world

EXIT_INTERNAL = 125

# N plain GETs through the HTTP door, one after another, then a marker file:
# the marker proves the program ran to its end; its absence, that it did not.
MANY_CONNECTIONS = r'''
import socket, sys
n, done = int(sys.argv[1]), sys.argv[2]
for i in range(n):
    with socket.create_connection(("127.0.0.1", 3128), timeout=30) as s:
        s.sendall(b"GET http://api.github.com/whoami HTTP/1.1\r\nHost: api.github.com\r\n"
                  b"Connection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
with open(done, "w") as out:
    out.write(f"{n}\n")
'''


def many(world, n: int, done: Path) -> list[str]:
    program = world.file("many_connections.py", MANY_CONNECTIONS)
    return [sys.executable, str(program), str(n), str(done)]


def whole_lines(data: bytes) -> list[dict]:
    """Every line whole and a valid event (the run may lack its end)."""
    assert data.endswith(b"\n"), data[-200:]
    events = [json.loads(line) for line in data.split(b"\n")[:-1]]
    for event in events:
        assert schema_problems(event) == [], event
    return events


def complete(data: bytes) -> list[dict]:
    events = whole_lines(data)
    assert check_run(events) == [], check_run(events)
    assert events[0]["type"] == "run.start" and events[-1]["type"] == "run.end"
    return events


def run_files(state_home: Path) -> list[Path]:
    runs = state_home / "vpnw" / "runs"
    return sorted(runs.glob("*.jsonl")) if runs.is_dir() else []


# ── fail closed on the record ───────────────────────────────────────────

@pytest.mark.parametrize("case", ["missing directory", "a directory", "not writable",
                                  "state home is a file", "stdout closed", "disk full at the start"])
def test_a_record_that_cannot_be_written_means_the_program_never_runs(world, user, case):
    work = world.workdir(user)
    marker = work / "the-program-ran"
    program = ["sh", "-c", f"touch {marker}"]
    env = None
    args = ["run"]
    expect = []
    if case == "missing directory":
        record = work / "no" / "such" / "run.jsonl"
        args += ["--record", str(record)]
        expect = [str(record), f"the directory {record.parent} does not exist", "fix: create it"]
    elif case == "a directory":
        args += ["--record", str(work)]
        expect = [str(work), "Is a directory", "fix: give --record a file you can write"]
    elif case == "not writable":
        # vpnwtest cannot open it; root can, and then every write fails.
        args += ["--record", "/proc/version"]
        expect = ["cannot write the record /proc/version: "]
    elif case == "state home is a file":
        state = world.file(f"not-a-dir-{user}", "x")
        env = {"XDG_STATE_HOME": str(state)}
        expect = [f"the state directory {state}/vpnw/runs", "fix: make that directory writable, "
                  "point XDG_STATE_HOME at a writable directory, or give --record FILE"]
    elif case == "stdout closed":
        args += ["--record", "-"]
        expect = ["stdout is closed or not writable", "fix:"]
    elif case == "disk full at the start":
        # /dev/full opens, and every write fails: run.start never reaches the
        # record, so the program is never let go.
        args += ["--record", "/dev/full"]
        expect = ["cannot write the record /dev/full: No space left on device"]
    argv = [str(world.vpnw_path), *args, "--", *program]
    if case == "stdout closed":
        argv = ["sh", "-c", 'exec "$@" >&-', "sh", *argv]
    r = world.run(argv, user=user, env=env)
    assert r.returncode == EXIT_INTERNAL, describe(r)
    for text in expect:
        assert text in r.stderr, (text, describe(r))
    assert not marker.exists(), "the program ran although its record could not be written"
    assert not (work / "no").exists(), "a directory was created for --record"
    if case not in ("disk full at the start", "not writable"):
        assert "the program was not run" in r.stderr   # the open failed, before anything started


def test_the_default_state_directory_is_created(world, user):
    state = world.state_home(user) / "fresh"
    work = world.workdir(user)
    # The parent is the user's; only vpnw's own state directory may appear.
    os.chown(state.parent, *owner(user))
    r = world.vpnw(["run", "--", "true"], user=user, env={"XDG_STATE_HOME": str(state)},
                   state_home=state)
    assert r.returncode == 0, describe(r)
    runs = state / "vpnw" / "runs"
    assert runs.is_dir() and (runs.stat().st_mode & 0o777) == 0o700
    assert len(list(runs.glob("*.jsonl"))) == 1
    assert list(work.iterdir()) == []


def owner(user: str) -> tuple[int, int]:
    import pwd
    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid


def read_in_world(world, path: Path) -> bytes:
    """A file as the world's mount namespace sees it (the small disk is there only)."""
    return subprocess.run(["nsenter", "-t", str(world.world_pid), "-m", "--", "cat", str(path)],
                          capture_output=True, check=True).stdout


@pytest.fixture
def small_disk(world):
    """A 48 KiB tmpfs mounted in the world's mount namespace, writable by all."""
    point = world.tmp / f"small-disk-{time.monotonic_ns()}"
    point.mkdir()
    world.in_world("mount", "-t", "tmpfs", "-o", "size=48k,mode=1777", "tmpfs", str(point))
    try:
        yield point
    finally:
        world.in_world("umount", str(point))
        point.rmdir()


def test_a_full_disk_mid_run_stops_the_program(world, user, small_disk):
    done = world.workdir(user) / "done"
    record = small_disk / "run.jsonl"
    r = world.vpnw(["run", "--record", str(record), "--", *many(world, 600, done)], user=user,
                   timeout=180)
    assert r.returncode == EXIT_INTERNAL, describe(r)
    assert f"cannot write the record {record}: No space left on device" in r.stderr, r.stderr
    assert "vpnw stops the program rather than run it unrecorded" in r.stderr
    assert not done.exists(), "the program ran to its end with its record failing"
    events = whole_lines(read_in_world(world, record))
    assert events[0]["type"] == "run.start"
    assert sum(e["type"] == "conn.request" for e in events) >= 10
    # The summary never claims a clean exit.
    assert "exit 0" not in r.stderr


def test_the_reader_of_record_stdout_gone_stops_the_program(world, user):
    done = world.workdir(user) / "done"
    inner = " ".join(map(str, [world.vpnw_path, "run", "--record", "-", "--", *many(world, 600, done)]))
    r = world.run(["bash", "-c", f'{inner} | head -1; exit "${{PIPESTATUS[0]}}"'], user=user, timeout=180)
    assert r.returncode == EXIT_INTERNAL, describe(r)
    assert "cannot write the record -: Broken pipe" in r.stderr, r.stderr
    assert not done.exists(), "the program ran to its end unrecorded"
    [line] = r.stdout.splitlines()
    assert json.loads(line)["type"] == "run.start"


# ── side outputs never hold the program ─────────────────────────────────

def test_a_consumer_that_never_reads_holds_nothing(world, user):
    done = world.workdir(user) / "done"
    n = 1500     # ~1.8 MB of events: more than the copy's buffer and the pipe
    r = world.vpnw(["run", "--events-to", "exec sleep 600", "--", *many(world, n, done)], user=user,
                   timeout=180)
    assert r.returncode == 0, describe(r)
    assert done.read_text() == f"{n}\n"
    [path] = run_files(r.state_home)
    events = complete(path.read_bytes())
    end = events[-1]["fields"]
    assert end["connections"] == n and end["failed"] == 0
    # Everything past what the pipe and the buffer could hold was dropped from the copy.
    assert 0 < end["events_to_lost"] < len(events)
    assert f"--events-to copy lost {end['events_to_lost']} events" in r.stderr
    assert "is not keeping up" in r.stderr
    assert "was stopped: it had not finished after the run ended" in r.stderr


def test_a_late_reader_gets_a_copy_and_the_loss_count_is_exact(world, user):
    """The consumer reads nothing until the program is done (a gate the test
    opens), then everything: what it got plus what run.end says it lost is
    every line before run.end, and what it got is the record's own lines."""
    work = world.workdir(user)
    done, copy, gate = work / "done", work / "copy.jsonl", work / "gate"
    os.mkfifo(gate)
    os.chown(gate, *owner(user))
    n = 1500
    consumer = f"cat {gate} > /dev/null; cat > {copy}"
    proc = world.popen([str(world.vpnw_path), "run", "--events-to", consumer, "--",
                        *many(world, n, done)], user=user,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 170
    while not done.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(gate, "w"):
        pass    # open and close: the consumer's first cat ends, the second reads
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    [path] = run_files(proc.state_home)
    record = path.read_bytes().splitlines(keepends=True)
    complete(b"".join(record))
    lost = json.loads(record[-1])["fields"]["events_to_lost"]
    got = copy.read_bytes().splitlines(keepends=True)
    before_end = [line for line in got if b'"type":"run.end"' not in line]
    assert lost > 0
    assert len(before_end) + lost == len(record) - 1
    # In order, and each one the record's line byte for byte.
    assert before_end == [line for line in record[:-1] if line in set(before_end)]


def test_sigterm_with_a_stuck_consumer_ends_the_run_at_once(world, user):
    work = world.workdir(user)
    started = work / "started"
    program = ["sh", "-c", f"curl -sS --max-time 30 -o /dev/null http://api.github.com/whoami; "
                           f"touch {started}; exec sleep 600"]
    proc = world.popen([str(world.vpnw_path), "run", "--events-to", "exec sleep 600", "--", *program],
                       user=user, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    # world.popen runs nsenter/setpriv/env, which all exec: proc.pid is vpnw.
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()
    [path] = run_files(proc.state_home)
    events = complete(path.read_bytes())
    assert events[-1]["fields"]["exit_code"] == 128 + signal.SIGTERM
    # Not the consumer's 600 s, nor the end-of-run grace the copy gets otherwise
    # (the bound is loose on purpose; scripts/bench_events_to.py measures it).
    assert took < 10, took

"""A run's first connection, in the test world, as root and as an unprivileged
user, through both doors.

The broker's loop loads in a thread begun when the doors come over the
link, just before the helper reports ready (stages/broker/startup.py), so a
program that connects at once may knock while the loop is still loading. Its connection waits at the door,
complete, and is served and recorded like any other; a broker killed while
it loads ends the run as a broker that stops mid-run does: 125, a complete
record, nothing out.

The moment "while the loop loads" is held, not raced: the broker marks
`loop import begun` (VPNW_STARTUP_TRACE, stages/startup/trace.py)
before its import thread starts, and that thread opens the loop's own
module (stages/broker/loop.py) before it can mark `loop loaded`; a gate on
that file (tests/open_gate.py, fanotify) holds the open of the process the
trace names as the broker, and only it, until the test lets it go. The
import is caught in every run, however fast start-up gets.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

from e2e_support import describe
from open_gate import OpenGate
from stages.record.check import check_run
from stages.record.events import read_events
from stages.startup import trace as startup_trace

pytestmark = pytest.mark.world

SIZE = 200_000
DOOR_PORTS = {"http": 3128, "socks": 1080}       # inside the sandbox (docs/architecture.md)
IMPORT_BEGUN, IMPORT_DONE = "loop import begun", "loop loaded"


def curl(door: str, seed: str) -> str:
    """curl through `door` as a tunnel (CONNECT with -p; SOCKS5 with the name
    sent) for SIZE bytes of the world's web server; prints what it got."""
    via = (f"-p -x http://127.0.0.1:{DOOR_PORTS['http']}" if door == "http"
           else f"--socks5-hostname 127.0.0.1:{DOOR_PORTS['socks']}")
    return (f"curl -sS --max-time 30 --noproxy '' {via} -o /dev/null -w '%{{size_download}}\\n' "
            f"'http://api.github.com/bytes/{SIZE}?seed={seed}'")


def read_record(path) -> list[dict]:
    with open(path, "rb") as f:
        return list(read_events(f, strict=True))


def by_conn(events: list[dict]) -> dict[int, list[dict]]:
    conns: dict[int, list[dict]] = {}
    for event in events:
        if event["type"].startswith("conn."):
            conns.setdefault(event["conn"], []).append(event)
    return conns


def shape(events: list[dict]) -> list[tuple[str, tuple[str, ...]]]:
    """A connection's events as their types and field names, in order."""
    return [(e["type"], tuple(sorted(e["fields"]))) for e in events]


def served(events: list[dict], door: str) -> None:
    types = [e["type"] for e in events]
    assert types[:2] == ["conn.request", "conn.open"] and types[-1] == "conn.close", types
    request = events[0]["fields"]
    assert (request["door"], request["host"], request["port"]) == (door, "api.github.com", 80), request
    assert events[-1]["fields"]["bytes_down"] >= SIZE, events[-1]


@pytest.mark.parametrize("door", ["http", "socks"])
def test_the_first_connection_is_served_and_recorded_like_the_next(world, user, door):
    """A program that connects at once (curl, straight after go) and then
    again: both are served in full, and the record shows the first exactly
    as it shows the second."""
    work = world.workdir(user)
    seed = "first-" + secrets.token_hex(4)
    record = work / "run.jsonl"
    r = world.vpnw(["run", "--record", str(record), "--", "sh", "-c",
                    f"{curl(door, seed + '-1')} && {curl(door, seed + '-2')}"], user=user)
    assert r.returncode == 0, describe(r)
    assert r.stdout.split() == [str(SIZE), str(SIZE)], describe(r)
    events = read_record(record)
    assert check_run(events) == [], check_run(events)
    conns = by_conn(events)
    assert sorted(conns) == [1, 2], conns
    for number in (1, 2):
        served(conns[number], door)
    assert shape(conns[1]) == shape(conns[2])
    assert events[-1]["type"] == "run.end" and events[-1]["fields"]["connections"] == 2


def marks(trace) -> list[tuple[int, str, str]]:
    """(pid, stage, what) of each complete line of the trace so far."""
    try:
        text = trace.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines(keepends=True):
        if line.endswith("\n"):
            _ns, pid, _cpu, stage, what = line.rstrip("\n").split(" ", 4)
            out.append((int(pid), stage, what))
    return out


def pid_of(trace, stage: str, what: str) -> int | None:
    return next((pid for pid, s, w in marks(trace) if (s, w) == (stage, what)), None)


def marked(trace, stage: str, what: str) -> bool:
    return pid_of(trace, stage, what) is not None


def wait_for(predicate, seconds: float, what: str, poll: float = 0.0005):
    deadline = time.monotonic() + seconds
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:.0f} s: {what}")
        time.sleep(poll)


def connected_to(helper_pid: int, port: int) -> bool:
    """A TCP connection to `port` complete in the sandbox's network namespace
    (the helper lives there): the program's, waiting in the door's backlog."""
    for table in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/{helper_pid}/net/{table}").read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":   # ESTABLISHED
                return True
    return False


def loop_module_files() -> list[str]:
    """The loop's module as vpnw (the venv's python, isolated) imports it:
    its source and, where there is one, its cached bytecode."""
    r = subprocess.run([sys.executable, "-I", "-c",
                        "import importlib.util as u, os; o = u.find_spec('stages.broker.loop').origin; "
                        "print(o); print(u.cache_from_source(o))"],
                       capture_output=True, text=True, cwd="/", timeout=60, check=True)
    return [path for path in r.stdout.splitlines() if os.path.exists(path)]


class CaughtRun:
    """`vpnw run` of a program, traced, with the broker held in its loop
    import: at its open of the loop's module, after `loop import begun`
    and before `loop loaded`."""

    def __init__(self, world, user: str, program: str):
        work = world.workdir(user)
        self.trace, self.record = work / "trace", work / "run.jsonl"
        self.gate = OpenGate(loop_module_files(),
                             hold=lambda pid: pid == pid_of(self.trace, "broker", IMPORT_BEGUN))
        try:
            self.proc = world.popen([str(world.vpnw_path), "run", "--record", str(self.record), "--",
                                     "sh", "-c", program],
                                    user=user, env={startup_trace.VARIABLE: str(self.trace)},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if not self.gate.held.wait(60):
                self.proc.kill()
                pytest.fail(f"the broker never opened the loop's module within 60 s\n{self.finish()}")
        except BaseException:
            self.gate.close()
            raise
        self.broker = self.gate.held_pid
        assert not marked(self.trace, "broker", IMPORT_DONE)

    def release(self) -> None:
        self.gate.release()

    def finish(self) -> tuple[int, str, str]:
        self.gate.release()
        try:
            out, err = self.proc.communicate(timeout=60)
        finally:
            self.gate.close()
        return self.proc.returncode, out, err


@pytest.mark.parametrize("door", ["http", "socks"])
def test_a_connection_that_comes_while_the_loop_loads_waits_and_is_served(world, user, door):
    """The broker is held in its import; the program connects meanwhile
    (its connection complete in the door's backlog); once the broker goes
    on, that connection is served in full and recorded: not lost, not
    refused."""
    seed = "loading-" + secrets.token_hex(4)
    run = CaughtRun(world, user, curl(door, seed))
    helper = wait_for(lambda: pid_of(run.trace, "helper", "Ready sent"), 60, "the helper's Ready")
    wait_for(lambda: connected_to(helper, DOOR_PORTS[door]), 60,
             "the program's connection at the door", poll=0.01)
    assert not marked(run.trace, "broker", IMPORT_DONE)         # it came while the loop was loading
    code, out, err = run.finish()
    assert code == 0, f"exit {code}\n{out}\n{err}"
    assert out.split() == [str(SIZE)], out + err
    events = read_record(run.record)
    assert check_run(events) == [], check_run(events)
    conns = by_conn(events)
    assert sorted(conns) == [1], conns
    served(conns[1], door)


def test_a_broker_killed_while_its_loop_loads_ends_the_run_125_with_a_complete_record(world, user):
    """Killed in its import (before go, or after it with the program
    knocking): vpnw exits 125 and says the broker stopped, the record ends
    with run.end saying so and checks clean, and nothing of the program got
    out (before go it never ran)."""
    seed = "killed-" + secrets.token_hex(4)
    run = CaughtRun(world, user, curl("http", seed))
    os.kill(run.broker, signal.SIGKILL)
    code, out, err = run.finish()
    assert code == 125, f"exit {code}\n{out}\n{err}"
    assert "broker stopped" in err, err
    events = read_record(run.record)
    end = events[-1]
    assert end["type"] == "run.end" and end["fields"]["exit_code"] == 125, end
    assert "broker" in end["fields"]["error"], end
    assert check_run(events) == [], check_run(events)
    assert not [e for e in events if e["type"] in ("conn.open", "conn.close")], events
    if not marked(run.trace, "program", "go, exec"):
        assert out == "", out               # never ran
    assert not [line for line in world.web_log() if seed in line]

"""Faults during a run, in the test world, as root and as an unprivileged user.

A stage killed mid-run (broker, recorder, helper) or vpnw itself killed: the
program never goes on unguarded or unrecorded, nothing more gets out, vpnw
exits 125 (or dies with its whole sandbox), and the record says what
happened. Hostile clients: 200 stalled connections do not lock the doors; a
destination that accepts and never answers leaves the client's timeout in
charge, and the record closes that connection at the end.
"""
from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_support import describe, wait_until
from progs_support import prog_text
from stages.record.events import read_events
from stages.record.check import check_run

pytestmark = pytest.mark.world

# The program: numbered plain-HTTP requests through the HTTP door, forever.
# Each request's URL carries the marker and its number, so the web server's
# log shows exactly which ones got out.
LOOPING_AGENT = prog_text("looping_agent.py")


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def processes_with(marker: str) -> list[int]:
    """Every live process on the machine whose argv holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if marker.encode() in argv and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def stages_of(vpnw_pid: int) -> dict[str, int]:
    """vpnw's three children, told apart by what they hold: the recorder has
    the run file open, the helper lives in the sandbox's network namespace,
    the broker is the third."""
    own_net = os.readlink(f"/proc/{vpnw_pid}/ns/net")
    found: dict[str, int] = {}
    for pid in children(vpnw_pid):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") != own_net:
                found["helper"] = pid
                continue
            fds = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, ProcessLookupError):
            continue
        targets = []
        for fd in fds:
            try:
                targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except (FileNotFoundError, ProcessLookupError):
                pass   # the broker opens and closes sockets all the time
        found["recorder" if any(t.endswith(".jsonl") for t in targets) else "broker"] = pid
    return found


class Running:
    """vpnw running the looping agent in the world."""

    def __init__(self, world, user: str):
        self.marker = "fault-" + secrets.token_hex(6)
        agent = world.file(f"agent-{self.marker}.py", LOOPING_AGENT)
        self.proc = world.popen([str(world.vpnw_path), "run", "--", sys.executable, str(agent), self.marker],
                                user=user, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.world = world
        try:
            # nsenter, setpriv and env exec in place: the Popen's pid becomes vpnw.
            # The stages are told apart once all three are there and settled
            # (the helper has left vpnw's network namespace, the recorder has
            # its run file open); the same look is the one kept.
            self.stages: dict[str, int] = {}

            def settled() -> bool:
                if b"vpnw" not in Path(f"/proc/{self.proc.pid}/cmdline").read_bytes():
                    return False
                self.stages = stages_of(self.proc.pid)
                return set(self.stages) == {"helper", "recorder", "broker"}

            wait_until(settled, what="vpnw and its three stages")
            # Wait for the program's first request to get out.
            self.first = self.proc.stdout.readline()
            assert self.first.startswith("ok 1"), self.first + self.proc.stderr.read()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """End this run at once (a failed test must not leave its agent looping
        in the world, where other tests count requests and look-ups)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=30)

    def logged(self) -> list[int]:
        """Numbers of the program's requests the web server saw."""
        return [int(m) for m in re.findall(rf"seed={self.marker}-(\d+)", "\n".join(self.world.web_log()))]

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, self.first + out, err

    def events(self) -> list[dict]:
        files = sorted((self.proc.state_home / "vpnw" / "runs").glob("*.jsonl"), key=os.path.getmtime)
        with open(files[-1], "rb") as f:
            return list(read_events(f, strict=True))


@pytest.fixture
def running(world, user):
    """Start the looping agent under vpnw; whatever the test does, the run is
    stopped at the end."""
    runs: list[Running] = []

    def start() -> Running:
        runs.append(Running(world, user))
        return runs[-1]

    yield start
    for run in runs:
        run.stop()


@pytest.mark.parametrize("stage", ["broker", "recorder", "helper"])
def test_a_stage_killed_mid_run_stops_the_program_and_vpnw_exits_125(running, stage):
    run = running()
    wait_until(lambda: len(run.logged()) >= 3, what="a few requests got out")
    os.kill(run.stages[stage], signal.SIGKILL)
    wait_until(lambda: not alive(run.stages[stage]), what=f"the {stage} is gone")
    out_at_kill = max(run.logged())
    code, out, err = run.finish()
    assert code == 125, f"exit {code}\n{out}\n{err}"
    # No process of the program survives, nor any stage.
    wait_until(lambda: not processes_with(run.marker), what="no process of the program")
    for name, pid in run.stages.items():
        wait_until(lambda: not alive(pid), what=f"the {name} ended")
    # Nothing got out after the kill but, at most, the one request in flight.
    assert max(run.logged()) <= out_at_kill + 1, (out_at_kill, run.logged()[-5:])
    if stage == "broker":
        assert "broker stopped" in err, err
        events = run.events()
        end = events[-1]
        assert end["type"] == "run.end" and end["fields"]["exit_code"] == 125
        assert "broker" in end["fields"]["error"], end
        # The connection in flight when the broker died may never have ended;
        # nothing else may be wrong with the record.
        allowed = re.compile(r"conn \d+: (conn\.request never ended|conn\.open without conn\.close)")
        problems = [p for p in check_run(events) if not allowed.match(p)]
        assert not problems, problems
    elif stage == "recorder":
        assert "recorder" in err and "unrecorded" in err, err
    else:
        assert "helper died" in err, err
        events = run.events()
        assert events[-1]["type"] == "run.end" and "helper" in events[-1]["fields"]["error"]
        assert not check_run(events), check_run(events)


def test_vpnw_killed_takes_the_whole_sandbox_with_it(running):
    run = running()
    os.kill(run.proc.pid, signal.SIGKILL)
    run.proc.wait(timeout=30)
    wait_until(lambda: not processes_with(run.marker), what="no process of the program survives vpnw")
    for name, pid in run.stages.items():
        wait_until(lambda: not alive(pid), what=f"the {name} ends after vpnw")
    seen = len(run.logged())
    # And nothing more gets out afterwards.
    time.sleep(0.3)
    assert len(run.logged()) == seen


SLOWLORIS_AGENT = prog_text("slowloris_agent.py")


def test_stalled_clients_do_not_lock_the_doors(world, user):
    agent = world.file("slowloris_agent.py", SLOWLORIS_AGENT)
    r = world.vpnw(["run", "--", sys.executable, str(agent)], user=user, timeout=120)
    assert r.returncode == 0, describe(r)
    assert r.stdout.strip().splitlines()[-1] == '{"served": 20, "held_open": 200}', describe(r)
    events = r.events()
    assert not check_run(events), check_run(events)
    opens = [e for e in events if e["type"] == "conn.open"]
    assert len(opens) == 20
    # The stalled ones end as handshake failures (the client closed), none as a request.
    fails = [e["fields"] for e in events if e["type"] == "conn.fail"]
    assert len(fails) == 200 and {f["stage"] for f in fails} == {"handshake"}, fails[:3]


SILENT_SERVER = prog_text("silent_server.py")


def test_a_destination_that_never_answers_leaves_the_client_timeout_in_charge(world, user):
    server_file = world.file("silent_server.py", SILENT_SERVER)
    # In the internet (which answers every address), not on the world's
    # loopback: the machine's own loopback is never dialled (issue 44).
    silent = "198.51.100.40"
    server = subprocess.Popen(["nsenter", "-t", str(world.internet_pid), "-n", "--", sys.executable,
                               str(server_file), silent], stdout=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    try:
        port = int(server.stdout.readline())
        r = world.vpnw(["run", "--", "curl", "-sS", "--max-time", "2", "-x", "http://127.0.0.1:3128",
                        f"http://{silent}:{port}/"], user=user, timeout=60)
        # curl's own timeout (28) is the program's exit code; vpnw adds nothing.
        assert r.returncode == 28, describe(r)
        events = r.events()
        assert not check_run(events), check_run(events)
        types = [e["type"] for e in events if e["conn"] is not None]
        assert types[0] == "conn.request" and "conn.open" in types and types[-1] == "conn.close", types
        assert events[-1]["fields"]["exit_code"] == 28
    finally:
        server.kill()
        server.wait()

"""Unix sockets among the program's own processes, end to end (issue 26), as
root and as the unprivileged user: a person's tmux inside vpnw, in a real
terminal (with the same session outside as the control), and a program that
serves itself over a Unix socket in a temp directory (asyncio, as test
suites and language servers do). The record holds no refusal for either.
Every way at a socket bound outside: tests/bypass/test_unix_origin.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from ci_support import cannot
from e2e_support import descendants, describe, run_events
from progs_support import prog_text
from tmux_support import world_shell

pytestmark = pytest.mark.world

SELF_SERVING = prog_text("self_serving.py")


def test_a_program_serves_itself_over_a_unix_socket(world, user):
    script = world.file("self_serving.py", SELF_SERVING)
    r = world.vpnw(["run", "--", "/usr/bin/python3", str(script)], user=user, timeout=120)
    assert r.returncode == 0, describe(r)
    assert "served 20 over /tmp/" in r.stdout
    events = run_events(r)
    assert not [e for e in events if e["type"].startswith("unix.")]
    assert next(e for e in events if e["type"] == "sandbox.ready")["fields"]["unix"] == "own"


def test_run_start_names_the_unix_allow_list_as_this_run_resolved_it(world, user):
    """[unix] allow's $VARIABLES are read once, when the run starts: run.start
    says what each entry named on this run (null for one that names nothing)."""
    policy = world.file("unix_allow.toml", 'version = 1\n[policy]\ndefault = "allow"\n[unix]\n'
                        'allow = ["$VPNW_TEST_SOCK", "$VPNW_TEST_UNSET", "/run/vpnw-test.sock"]\n')
    r = world.vpnw(["run", "--policy", str(policy), "--", "/bin/true"], user=user,
                   env={"VPNW_TEST_SOCK": "/tmp/vpnw-test-agent.sock"}, timeout=120)
    assert r.returncode == 0, describe(r)
    start = run_events(r)[0]
    assert start["type"] == "run.start"
    assert start["fields"]["unix_allow"] == [
        {"entry": "$VPNW_TEST_SOCK", "path": "/tmp/vpnw-test-agent.sock"},
        {"entry": "$VPNW_TEST_UNSET", "path": None},
        {"entry": "/run/vpnw-test.sock", "path": "/run/vpnw-test.sock"}]
    assert "unix_allow_unlisted" not in start["fields"]



# TCP connects of a program of one thread, then of four (non-blocking, as
# Node, Go and tokio make them), each to a listener of its own; then it waits
# for a line, so the test can look at the run's supervisor meanwhile.
CONNECTS_THEN_WAITS = prog_text("connects_then_waits.py")


def _supervisor(run: subprocess.Popen) -> int:
    """The run's supervisor: its one process holding a seccomp listener."""
    for _ in range(200):
        for pid in descendants(run.pid):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
                if any(os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:seccomp notify"
                       for fd in fds):
                    return pid
            except OSError:
                continue        # gone meanwhile, or an fd closed between the two looks
        time.sleep(0.05)
    raise AssertionError("no process of the run holds a seccomp listener")


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_the_supervisor_of_a_real_run_answers_through_the_path_doctor_names(world, user, path):
    """The supervisor of a run that made TCP connects (a thread alone, then
    threads among others) has the compiled path (stages/helper/supervisor/fast_continue.c)
    mapped: it waits for and answers notifications there, as setup builds it
    and doctor says; with VPNW_SUPERVISOR_PYTHON=1 it has not, and the Python
    path answered them."""
    script = world.file("connects_then_waits.py", CONNECTS_THEN_WAITS)
    env = {"VPNW_SUPERVISOR_PYTHON": "1"} if path == "python" else {}
    run = world.popen([str(world.vpnw_path), "run", "--", "/usr/bin/python3", str(script)],
                      user=user, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE)
    mapped = None
    try:
        line = run.stdout.readline()
        if line == b"connected\n":
            with open(f"/proc/{_supervisor(run)}/maps") as f:
                mapped = "/stages/helper/supervisor/fast_continue." in f.read()
    finally:
        _out, err = run.communicate(b"\n", timeout=60)
    assert line == b"connected\n" and run.returncode == 0, (line, err.decode())
    assert mapped == (path == "compiled")

INTERRUPTED = prog_text("interrupted_connect.py")


@pytest.mark.parametrize("where", ["vpnw", "outside"])
def test_a_connect_a_signal_ends_is_not_made_behind_the_programs_back(world, user, where):
    """A blocking connect() waits on a full backlog; a signal (handled, no
    SA_RESTART) comes while it waits, then room is made. Outside, the connect
    ends with EINTR and the socket stays unconnected. Inside, the supervisor
    makes the connect: the program must never be told EINTR while its socket
    gets connected anyway (the filter waits killable once the supervisor has
    the notification: the connect ends when room is made, with 0)."""
    script = world.file("interrupted_connect.py", INTERRUPTED)
    argv = ["/usr/bin/python3", str(script)]
    r = world.vpnw(["run", "--", *argv], user=user, timeout=60) if where == "vpnw" \
        else world.run(argv, user=user, timeout=60)
    assert r.returncode == 0, describe(r)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got in ({"error": "0", "connected": True}, {"error": "EINTR", "connected": False}), got
    if where == "outside":
        assert got == {"error": "EINTR", "connected": False}, got     # the kernel's own way


@pytest.fixture
def term(world, user, tmp_path):
    if shutil.which("tmux") is None:
        cannot("tmux is missing (scripts/setup installs it)")
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


KNOCKS = prog_text("knocks.py")


@pytest.mark.parametrize("knocks_at", ["doors", "own listener"])
def test_a_connect_to_a_door_goes_on_without_a_listener_look(world, user, knocks_at):
    """The doors' ports count as listened on from the start (the helper
    listens there before the program runs): a program's first non-blocking
    connect to each door goes on at once, and no process of the run loads
    the sock_diag look the supervisor makes for a loopback port it has not
    seen a listener on (stages/kernel/inet_diag.py), which cost that first
    connect some ms. Control: the same connect to a listener of the
    program's own makes that look, and the audit sees it."""
    from e2e_support import audited_run
    from stages.wire.handoff import DOORS
    work = world.workdir(user)
    script = world.file("knocks.py", KNOCKS)
    ports = [str(p) for p in DOORS.values()] if knocks_at == "doors" else []
    at, imported = audited_run(world, user, work, ["run", "--record", str(work / "run.jsonl"), "--",
                                                   "/usr/bin/python3", str(script), *ports])
    looked = {pid for _ns, pid, name in imported if name == "stages.kernel.inet_diag"}
    assert ("helper", "supervisor started") in at
    if knocks_at == "doors":
        assert not looked
    else:
        assert looked

"""The record as a person reads it back (issue 45, issue 42), in the test
world, as root and as vpnwtest: `vpnw runs` never says "ok" for a file that
`show --verify` fails; `show --verify` of a run still going says so, with its
own exit code (124), and checks what is there so far; a ledger that cannot be
read is said in one line, never a traceback."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from e2e_support import describe, runs_in
from tmux_support import wait_file

pytestmark = pytest.mark.world

STILL_RUNNING = 124


def ledger_column(listing: str, run_id: str) -> str:
    for line in listing.splitlines():
        if line.startswith(run_id + " "):
            return line.split()[-1]
    raise AssertionError(f"no row for {run_id} in:\n{listing}")


def edit_in_place(path: Path, old: bytes, new: bytes) -> None:
    """Change bytes in the middle of the file as an editor would, same length,
    the file's last line (and so its last digest) left as it was."""
    assert len(old) == len(new)
    data = path.read_bytes()
    lines = data.split(b"\n")
    middle = next(i for i, line in enumerate(lines[1:-2], 1) if old in line)
    lines[middle] = lines[middle].replace(old, new, 1)
    with open(path, "r+b") as out:
        out.write(b"\n".join(lines))


def test_runs_does_not_say_ok_for_a_file_edited_in_place(world, user):
    state = world.state_home(user)
    r = world.vpnw(["trace", "--", "sh", "-c", "curl -sS --max-time 30 -o /dev/null "
                    "http://api.github.com/whoami"], user=user, state_home=state)
    assert r.returncode == 0, describe(r)
    [path] = runs_in(state)
    run_id = path.name.removesuffix(".jsonl")
    # The control: as written, every layer holds and the list says ok.
    listing = world.vpnw(["runs"], user=user, state_home=state)
    assert ledger_column(listing.stdout, run_id) == "ok", describe(listing)
    assert world.vpnw(["show", "--verify", run_id], user=user, state_home=state).returncode == 0
    edit_in_place(path, b"api.github.com", b"api.gitlab.com")
    verify = world.vpnw(["show", "--verify", run_id], user=user, state_home=state)
    assert verify.returncode == 1, describe(verify)
    listing = world.vpnw(["runs"], user=user, state_home=state)
    assert listing.returncode == 0, describe(listing)
    assert ledger_column(listing.stdout, run_id) == "CHANGED", describe(listing)
    as_json = world.vpnw(["runs", "--json"], user=user, state_home=state)
    assert '"ledger": "CHANGED"' in as_json.stdout, describe(as_json)


def test_verify_of_a_run_still_going_says_so_with_its_own_code(world, user):
    state, work = world.state_home(user), world.workdir(user)
    started, stop = work / "started", work / "stop"
    program = (f"curl -sS --max-time 30 -o /dev/null http://api.github.com/whoami; touch {started}; "
               f"while [ ! -e {stop} ]; do sleep 0.1; done")
    proc = world.popen([str(world.vpnw_path), "run", "--", "sh", "-c", program], user=user,
                       state_home=state, cwd=work, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    try:
        wait_file(started)
        [path] = runs_in(state)
        run_id = path.name.removesuffix(".jsonl")
        r = world.vpnw(["show", "--verify", run_id], user=user, state_home=state)
        assert r.returncode == STILL_RUNNING, describe(r)
        first, *rest = r.stdout.splitlines()
        assert first.startswith(f"{path}: still running: the chain is whole so far, "), describe(r)
        assert "was cut" not in r.stdout and "FAILED" not in r.stdout, describe(r)
        assert rest == ["signature: not yet: vpnw signs the run when it ends",
                        f"ledger: not yet: the run is entered in {state}/vpnw/ledger.jsonl when it ends"], \
            describe(r)
        listing = world.vpnw(["runs"], user=user, state_home=state)
        assert "running" in listing.stdout, describe(listing)
        # What is there so far is checked: an edit before the end is still a failure (1).
        edit_in_place(path, b"api.github.com", b"api.gitlab.com")
        r = world.vpnw(["show", "--verify", run_id], user=user, state_home=state)
        assert r.returncode == 1 and "the chain breaks here" in r.stdout, describe(r)
        edit_in_place(path, b"api.gitlab.com", b"api.github.com")
    finally:
        stop.touch()
        assert proc.wait(timeout=60) == 0
    # Ended: whole, signed, in the ledger.
    r = world.vpnw(["show", "--verify", run_id], user=user, state_home=state)
    assert r.returncode == 0, describe(r)


@pytest.mark.parametrize("how", ["loop", "not-theirs"])
def test_verify_with_an_unreadable_ledger_says_so_in_one_line(world, user, how):
    if how == "not-theirs" and user == "root":
        pytest.skip("root reads every file: the loop of links is root's unreadable ledger")
    state = world.state_home(user)
    r = world.vpnw(["trace", "--", "true"], user=user, state_home=state)
    assert r.returncode == 0, describe(r)
    ledger = state / "vpnw" / "ledger.jsonl"
    if how == "loop":
        ledger.unlink()
        os.symlink(ledger.name, ledger)        # a link to itself: ELOOP
    else:
        os.chown(ledger, 0, 0)                  # a run under sudo left it root's
    try:
        r = world.vpnw(["show", "--verify"], user=user, state_home=state)
        assert "Traceback" not in r.stderr, describe(r)
        assert r.returncode == 2, describe(r)      # unproven: nothing to check it against
        why = "Too many levels of symbolic links" if how == "loop" else "Permission denied"
        [line] = [l for l in r.stdout.splitlines() if l.startswith("ledger: ")]
        assert line.startswith(f"ledger: not checked: cannot read {ledger}: {why} "), describe(r)
        listing = world.vpnw(["runs"], user=user, state_home=state)
        assert listing.returncode == 0 and "Traceback" not in listing.stderr, describe(listing)
        assert listing.stderr == f"vpnw: cannot read {ledger}: {why} (the ledger of runs is the user's " \
                                 "own file, 0600: read it as the user whose runs it lists, or give " \
                                 "it back to them)\n", describe(listing)
    finally:
        ledger.unlink()


def test_a_run_id_prefix_is_taken_where_a_run_id_is(world, user):
    """As git takes a short hash: `show` and `learn --from` take the start of
    a run id (with or without "r-"); one that begins several runs is refused
    (121), naming them."""
    state = world.state_home(user)
    for _ in range(2):
        r = world.vpnw(["trace", "--", "curl", "-sS", "-o", "/dev/null", "http://api.github.com/whoami"],
                       user=user, state_home=state)
        assert r.returncode == 0, describe(r)
    first, second = (p.name.removesuffix(".jsonl") for p in runs_in(state))
    common = os.path.commonprefix([first, second])
    for prefix in (first[:len(common) + 1], first[2:len(common) + 1]):
        r = world.vpnw(["show", "--verify", prefix], user=user, state_home=state)
        assert r.returncode == 0 and r.stdout.startswith(str(state / "vpnw" / "runs" / first)), \
            describe(r)
    learned = world.vpnw(["learn", "--from", first[:len(common) + 1]], user=user, state_home=state)
    assert learned.returncode == 0 and "api.github.com" in learned.stdout, describe(learned)
    for command in (["show", common], ["learn", "--from", common]):
        r = world.vpnw(command, user=user, state_home=state)
        assert r.returncode == 121, describe(r)
        assert f"run id {common!r} is ambiguous: 2 runs in" in r.stderr, describe(r)
        assert f"  {first}  " in r.stderr and f"  {second}  " in r.stderr, describe(r)
        assert "trace curl" in r.stderr, describe(r)
    r = world.vpnw(["show", "r-zzzz"], user=user, state_home=state)
    assert r.returncode == 121 and "no run 'r-zzzz'" in r.stderr, describe(r)

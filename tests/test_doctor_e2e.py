"""`vpnw doctor` end to end, and vpnw where agents run: as root, as an
unprivileged user, and inside a container-like nested user namespace (with
and without a network namespace of its own), each with a real client run.

Where user namespaces are off (max_user_namespaces = 0 in a namespace of our
own, the way a locked-down host has it), doctor says so and exits non-zero,
and `vpnw guard` exits 122 pointing at `vpnw doctor` without running the
program. As the control, the same run with namespaces on does run it.
"""
from __future__ import annotations

import json
import re
import shlex
import sys

import pytest

from e2e_support import describe
from progs_support import prog_text
from stages.orchestrator.doctor import run_checks
from stages.record.events import read_events
from stages.record.check import check_run

pytestmark = pytest.mark.world

POLICY = 'version = 1\nname = "doc"\n\n[policy]\ndefault = "deny"\nallow = ["api.github.com"]\n'


def test_doctor_is_ok_here_and_json_has_every_check(world, user):
    r = world.vpnw(["doctor"], user=user)
    assert r.returncode == 0, describe(r)
    j = world.vpnw(["doctor", "--json"], user=user)
    assert j.returncode == 0, describe(j)
    checks = [json.loads(line) for line in j.stdout.splitlines() if line.strip()]
    names = {c["name"] for c in checks}
    expected = {c.name for c in run_checks()}
    assert expected <= names, (expected - names, j.stdout)
    assert all(set(c) >= {"name", "status", "detail", "fix"} for c in checks)
    assert all(c["status"] != "fail" for c in checks), j.stdout
    for c in checks:
        assert c["name"] in r.stdout


def test_doctor_says_which_path_answers_continue(world, user):
    """scripts/setup builds the supervisor's compiled "continue"
    (stages/helper/supervisor/fast_continue.c): doctor names it; with it turned off
    (as where it did not build), doctor names the Python path."""
    def detail(env=None):
        j = world.vpnw(["doctor", "--json"], user=user, env=env)
        return next(json.loads(line) for line in j.stdout.splitlines()
                    if '"unix_sockets"' in line)["detail"]
    assert "answered by the compiled (fast_continue) path" in detail()
    assert "answered by the Python (VPNW_SUPERVISOR_PYTHON is set) path" in \
        detail({"VPNW_SUPERVISOR_PYTHON": "1"})


def userns_off(world, user: str, command: list):
    """Run `command` in a user namespace of our own whose max_user_namespaces is 0."""
    script = ("echo 0 > /proc/sys/user/max_user_namespaces && exec "
              + " ".join(shlex.quote(str(a)) for a in command))
    return world.run(["unshare", "--user", "--map-root-user", "--fork", "sh", "-c", script],
                     user=user, timeout=60)


def test_with_user_namespaces_off_doctor_fails_and_guard_exits_122(world, user):
    marker = world.workdir(user) / "program-ran"
    policy = world.file("doctor_policy.toml", POLICY)
    doctor = userns_off(world, user, [world.vpnw_path, "doctor"])
    assert doctor.returncode != 0, describe(doctor)
    assert "max_user_namespaces" in doctor.stdout and "fail" in doctor.stdout, describe(doctor)

    guard = userns_off(world, user, [world.vpnw_path, "guard", "--policy", policy, "--",
                                     "touch", marker])
    assert guard.returncode == 122, describe(guard)
    assert "vpnw doctor" in guard.stderr, describe(guard)
    assert not marker.exists(), "the program ran without its sandbox"
    # The control: the same guard with namespaces on runs the program.
    control = world.vpnw(["guard", "--policy", str(policy), "--", "touch", str(marker)], user=user)
    assert control.returncode == 0, describe(control)
    assert marker.exists()


# --- vpnw inside a container-like nested user namespace ----------------------

NESTED_DRIVER = prog_text("doctor_nested_driver.py")


@pytest.mark.parametrize("net", ["shared-net", "own-net"])
def test_vpnw_builds_its_sandbox_inside_a_nested_user_namespace(world, user, net):
    driver = world.file("nested_driver.py", NESTED_DRIVER)
    flags = ["--user", "--map-root-user", "--mount"] + (["--net"] if net == "own-net" else [])
    r = world.run(["unshare", *flags, "--", sys.executable, str(driver), str(world.vpnw_path), net],
                  user=user, timeout=180)
    assert r.returncode == 0, describe(r)
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["uid"] == 0, result          # mapped root, as in a rootless container
    assert result["code"] == 0, result
    if net == "own-net":
        assert result["out"] == "nested-ok", result
    else:
        assert json.loads(result["out"])["host"] == "api.github.com", result
    files = sorted(r.run_files())
    with open(files[-1], "rb") as f:
        events = list(read_events(f, strict=True))
    assert not check_run(events), check_run(events)
    assert [e["fields"]["namespaces"] for e in events if e["type"] == "sandbox.ready"]
    assert sum(1 for e in events if e["type"] == "conn.open") == 1


# --- on a terminal: lines wrapped to its width (issue 28) ---------------------

def test_doctor_wraps_its_lines_to_the_terminal_width(world, user, tmp_path):
    from tmux_support import world_shell
    width = 72
    # The control: through a pipe every check is one line, and some are wider than the pane.
    piped = world.vpnw(["doctor"], user=user)
    assert piped.returncode == 0, describe(piped)
    assert max(len(line) for line in piped.stdout.splitlines()) > width, piped.stdout
    screen = world_shell(world, user, tmp_path)
    try:
        screen.resize(width, 40)
        mark = screen.start(f"{screen.vpnw} doctor")
        assert screen.finished(mark) == 0
        # capture-pane -J joins the rows a terminal wrapped: a joined line wider
        # than the pane is one doctor did not wrap.
        shown = screen.history().splitlines()
        start = next(i for i, line in enumerate(shown) if "doctor; echo" in line)
        end = next(i for i, line in enumerate(shown) if line.startswith(f"@@{mark}@@42@@"))
        output = shown[start + 1:end]
    finally:
        screen.close()
    checks = [line for line in output if re.match(r"^(ok|warn|fail) ", line)]
    assert {c.name for c in run_checks()} <= {line.split()[1] for line in checks}, output
    variables = [line for line in output if re.match(r"^ {8}[A-Za-z_]+=", line)]
    too_wide = [line for line in output if len(line) > width and line not in variables]
    assert not too_wide, output
    assert any(line.startswith(" " * 6) and not line.startswith(" " * 8) for line in output), output
    # The variables' values stay whole, to be copied (the terminal wraps them).
    assert any(line.strip().startswith("GIT_SSH_COMMAND=ssh -o 'ProxyCommand=") and
               line.endswith("%h %p'") for line in variables), variables

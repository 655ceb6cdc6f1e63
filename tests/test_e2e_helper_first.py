"""The helper forked first (stages/orchestrator/helper_first.py; docs/architecture.md,
"Start-up budget"): vpnw forks it right after the command line is read, and it
waits for its plan having made nothing (no namespace). A run refused before the
plan (a bad policy) says what it always said, exits 121 and leaves no helper
behind; a vpnw killed before the plan takes the helper with it.

vpnw is held before its plan by `--policy -` on a pipe the test holds: it
reads the policy to the pipe's end, while the helper, already forked, waits.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import time

import pytest

from stages.config.inputs import source_name
from stages.config.policy import PolicyError, parse_policy
from stages.startup import trace as startup_trace

pytestmark = pytest.mark.world

BAD_POLICY = 'version = 1\n[policy]\nallow = ["exa mple.com"]\n'


def _marks(trace) -> list[tuple[int, str, str]]:
    if not trace.exists():
        return []
    out = []
    for line in trace.read_text().splitlines():
        _ns, pid, _cpu, stage, what = line.split(" ", 4)
        out.append((int(pid), stage, what))
    return out


def _pid_of(trace, stage: str, what: str, timeout: float = 30) -> int:
    """The pid that marked `stage: what`, once it has (the test's wait, never the product's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid, s, w in _marks(trace):
            if (s, w) == (stage, what):
                return pid
        time.sleep(0.02)
    raise AssertionError(f"no {stage}: {what} in {_marks(trace)}")


def _held_before_the_plan(world, user):
    """vpnw reading its policy from a pipe, its helper forked and waiting:
    (the Popen, the trace, vpnw's pid, the helper's pid)."""
    trace = world.workdir(user) / "trace"
    proc = world.popen([str(world.vpnw_path), "run", "--policy", "-", "--record", "-", "--", "true"], user=user,
                       env={startup_trace.VARIABLE: str(trace)}, stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    helper = _pid_of(trace, "helper", "seccomp filter built")
    vpnw = _pid_of(trace, "vpnw", "helper forked")
    assert helper != vpnw
    # Before its plan the helper has made no namespace: it is in vpnw's own.
    for ns in ("user", "net", "mnt", "pid"):
        assert os.readlink(f"/proc/{helper}/ns/{ns}") == os.readlink(f"/proc/{vpnw}/ns/{ns}"), ns
    return proc, trace, vpnw, helper


def _gone_within(pidfd: int, seconds: float) -> bool:
    return bool(select.select([pidfd], [], [], seconds)[0])


def _expected_refusal(text: str) -> str:
    with pytest.raises(PolicyError) as refused:
        parse_policy(text, source=source_name("-"))
    return f"vpnw: {refused.value}\n"


def test_a_bad_policy_is_refused_as_before_and_leaves_no_helper(world, user):
    proc, trace, _vpnw, helper = _held_before_the_plan(world, user)
    pidfd = os.pidfd_open(helper)
    try:
        assert not _gone_within(pidfd, 0)          # control: the early helper is there, waiting
        _out, err = proc.communicate(BAD_POLICY.encode(), timeout=60)
        assert proc.returncode == 121
        assert err.decode() == _expected_refusal(BAD_POLICY)
        # vpnw killed and reaped it before exiting: it is not even a zombie.
        assert _gone_within(pidfd, 0)
        assert not os.path.exists(f"/proc/{helper}")
    finally:
        os.close(pidfd)
    assert ("helper", "plan read") not in {(s, w) for _pid, s, w in _marks(trace)}


def test_a_vpnw_killed_before_the_plan_takes_the_helper_with_it(world, user):
    proc, trace, vpnw, helper = _held_before_the_plan(world, user)
    pidfd = os.pidfd_open(helper)
    try:
        assert not _gone_within(pidfd, 0.2)        # control: alive while vpnw is
        os.kill(vpnw, signal.SIGKILL)
        assert _gone_within(pidfd, 20)
    finally:
        os.close(pidfd)
        proc.kill()
        proc.communicate(timeout=30)
    marks = {(s, w) for _pid, s, w in _marks(trace)}
    assert not {("helper", "plan read"), ("helper", "namespaces made"), ("init", "fresh /proc"),
                ("program", "sealed, exec")} & marks

"""The helper's CPU on its way to Ready (docs/architecture.md, "Start-up
budget"): what it spent there that no run needed.

- Garbage collections: from its fork until Ready the helper (and init and
  the program's process, forked from it) only import and build, so a
  collection found nothing to free; it is off there and on again after
  Ready, what exists then frozen out of its sight (processes.collect_from_now).
- prctl, unshare, mount, capset, seccomp(2), libseccomp's version and the
  supervisor's notify calls go through stages/kernel/foreign.py: each call
  answers as ctypes' does (compared below, and in
  tests/test_unix_supervisor.py), and the program's seal is the real one
  (tests/test_helper_filter_bytes.py, tests/bypass/). (The helper's socket
  without selectors and these calls through `_ctypes` alone, without the
  ctypes package, bought under 1 ms each: dropped, stages/startup/tricks.py.)

A real run as root and as vpnwtest, plain and with --capture, shows no
collection in the helper before Ready nor in init before it forks the
program (control: vpnw's own collection is seen by the same hook). With
the start-up tricks off (VPNW_STARTUP_TRICKS=off) the collector is left
alone, and that test is skipped."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from e2e_support import audited_run
from progs_support import prog_text
from stages import startup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.world
@pytest.mark.skipif(not startup.ON, reason="VPNW_STARTUP_TRICKS=off: the collector is left alone")
def test_the_helper_collects_nothing_before_ready(world, user):
    work = world.workdir(user)
    for way in ([], ["--capture"]):
        at, seen = audited_run(world, user, work, ["run", *way, "--record", str(work / f"run{len(way)}.jsonl"),
                                                   "--", "true"], tag=str(len(way)), collections_too=True)
        vpnw_pid = at[("vpnw", "helper forked")][1]
        ready, helper_pid = at[("helper", "Ready sent")]
        program_forked, init_pid = at[("init", "program forked")]
        assert any(pid == vpnw_pid and name == "(gc)" for _ns, pid, name in seen), way   # control
        helpers = {name for ns, pid, name in seen if pid == helper_pid and ns < ready}
        assert "stages.helper.seal" in helpers, way                                        # control
        assert "(gc)" not in helpers, way
        inits = {name for ns, pid, name in seen if pid == init_pid and ns < program_forked}
        assert "(gc)" not in inits, way


THE_HELPERS_KERNEL_CALLS = prog_text("the_helpers_kernel_calls.py")


def test_the_helpers_kernel_calls_answer_as_ctypes_does(tmp_path):
    """privileges' calls, libseccomp's version and API level, the seccomp
    loader and the supervisor's notify calls, in a fresh interpreter: the
    answers are the kernel's (an errno as OSError), and libseccomp's version
    and API level are what ctypes reads."""
    out = subprocess.run([sys.executable, "-c", THE_HELPERS_KERNEL_CALLS], cwd=tmp_path, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                         text=True).stdout.splitlines()
    missing, ours, dumpable, mount_errno, theirs = out
    assert missing == "None"
    assert dumpable == "1"
    assert mount_errno in ("1", "2")        # EPERM (not root), ENOENT (root)
    (major, minor, micro), api = eval(theirs)       # noqa: S307 - our own printout
    assert ours == f"(_Version(major={major}, minor={minor}, micro={micro}), {api})"

"""The helper's CPU on its way to Ready (docs/architecture.md, "Start-up
budget"): what it spent there that no run needed.

- Garbage collections: from its fork until Ready the helper (and init and
  the program's process, forked from it) only import and build, so a
  collection found nothing to free; it is off there and on again after
  Ready, what exists then frozen out of its sight (sandbox.collect_from_now).
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

from e2e_support import IMPORTS_AUDITED_RUN, audited_run
from stages import startup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each collection's start, as `<ns> <pid> gc` in the imports file (the hook
# is inherited across fork); vpnw collects once first, the control.
COLLECTIONS_TOO = """
import gc, os, sys, time
def _collection(phase, _info):
    if phase == "start":
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, f"{time.clock_gettime_ns(time.CLOCK_MONOTONIC)} {os.getpid()} (gc)\\n".encode())
        os.close(fd)
gc.callbacks.append(_collection)
gc.collect()
""" + IMPORTS_AUDITED_RUN


@pytest.mark.world
@pytest.mark.skipif(not startup.ON, reason="VPNW_STARTUP_TRICKS=off: the collector is left alone")
def test_the_helper_collects_nothing_before_ready(world, user):
    work = world.workdir(user)
    for way in ([], ["--capture"]):
        at, seen = audited_run(world, user, work, ["run", *way, "--record", str(work / f"run{len(way)}.jsonl"),
                                                   "--", "true"], tag=str(len(way)), script=COLLECTIONS_TOO)
        vpnw_pid = at[("vpnw", "helper forked")][1]
        ready, helper_pid = at[("helper", "Ready sent")]
        program_forked, init_pid = at[("init", "program forked")]
        assert any(pid == vpnw_pid and name == "(gc)" for _ns, pid, name in seen), way   # control
        helpers = {name for ns, pid, name in seen if pid == helper_pid and ns < ready}
        assert "stages.helper.sandbox" in helpers, way                                     # control
        assert "(gc)" not in helpers, way
        inits = {name for ns, pid, name in seen if pid == init_pid and ns < program_forked}
        assert "(gc)" not in inits, way


THE_HELPERS_KERNEL_CALLS = """
import sys
from stages.kernel import privileges
from stages.helper import seccomp_rules, unix_supervisor
print(unix_supervisor.missing())
print(seccomp_rules.libseccomp_version())
seccomp_rules.loader()
print(privileges.prctl(3))          # PR_GET_DUMPABLE
try:
    privileges.mount(None, "/nonexistent-vpnw", None, 0)
except OSError as e:
    print(e.errno)
from stages.kernel import seccomp_notify
import ctypes
class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]
library = ctypes.CDLL("libseccomp.so.2")
library.seccomp_version.restype = ctypes.POINTER(Version)
v = library.seccomp_version().contents
print(((v.major, v.minor, v.micro), library.seccomp_api_get()))
"""


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

"""The helper's CPU on its way to Ready (docs/architecture.md, "Start-up
budget"): what it spent there that no run needed.

- Garbage collections: from its fork until Ready the helper (and init and
  the program's process, forked from it) only import and build, so a
  collection found nothing to free; it is off there and on again after
  Ready, what exists then frozen out of its sight (processes.collect_from_now).
- selectors: socket.py imports it for socket.sendfile alone, and its import
  makes and closes an epoll to choose a DefaultSelector; the helper's socket
  is imported with a stand-in selectors that loads the real one the first
  time a name is asked of it (stages/helper/main.py).
- ctypes: prctl, unshare, mount, capset, seccomp(2), libseccomp's version
  and the supervisor's notify calls go through `_ctypes` alone
  (stages/kernel/foreign.py). Each call answers as ctypes' did (compared
  below, and in tests/test_unix_supervisor.py), and the program's seal is
  the real one (tests/test_helper_filter_bytes.py, tests/bypass/).

A real run as root and as vpnwtest, plain and with --capture, shows no
collection in the helper before Ready nor in init before it forks the
program, and neither selectors nor ctypes (capture's libnftables included)
among the helper's imports before Ready (controls:
vpnw's own collection is seen by the same hook, and selectors is seen when
another process of the run imports it)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from e2e_support import audited_run
from progs_support import prog_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.world
def test_the_helper_neither_collects_nor_loads_selectors_before_ready(world, user):
    work = world.workdir(user)
    for way in ([], ["--capture"]):
        at, seen = audited_run(world, user, work, ["run", *way, "--record", str(work / f"run{len(way)}.jsonl"),
                                                   "--", "true"], tag=str(len(way)), collections_too=True)
        vpnw_pid = at[("vpnw", "helper forked")][1]
        ready, helper_pid = at[("helper", "Ready sent")]
        program_forked, init_pid = at[("init", "program forked")]
        assert any(pid == vpnw_pid and name == "(gc)" for _ns, pid, name in seen), way   # control
        assert any(name == "selectors" for _ns, _pid, name in seen), way                  # control
        helpers = {name for ns, pid, name in seen if pid == helper_pid and ns < ready}
        assert "stages.helper.seal" in helpers, way                                        # control
        assert "(gc)" not in helpers, way
        assert "selectors" not in helpers, way
        # capture's libnftables too goes through _ctypes (stages/helper/capture.py)
        assert "_ctypes" in helpers, way                                                   # control
        assert "ctypes" not in helpers, way
        inits = {name for ns, pid, name in seen if pid == init_pid and ns < program_forked}
        assert "(gc)" not in inits, way


THE_HELPERS_SOCKET = prog_text("the_helpers_socket.py")


def test_the_helpers_socket_loads_selectors_only_when_asked(tmp_path):
    """In a fresh interpreter, as the helper starts: socket is loaded, its
    selectors not; the first name asked of it loads the real module, which
    any later import then gets (and socket's name for it is that module)."""
    out = subprocess.run([sys.executable, "-c", THE_HELPERS_SOCKET], cwd=tmp_path, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                         text=True).stdout.split()
    assert out == ["False", "True", "EpollSelector", "True"]
    plain = subprocess.run([sys.executable, "-c", "import sys, socket; print('selectors' in sys.modules)"],
                           check=True, capture_output=True, text=True).stdout.split()
    assert plain == ["True"]        # control: a plain import of socket loads it


THE_HELPERS_KERNEL_CALLS = prog_text("the_helpers_kernel_calls.py")


def test_the_helpers_kernel_calls_need_no_ctypes_and_answer_as_it_did(tmp_path):
    """privileges' calls, libseccomp's version and API level, the seccomp
    loader and the supervisor's notify calls, in a fresh interpreter: ctypes
    is not loaded (control: landlock, which uses it, loads it), the answers
    are the kernel's (an errno as OSError), and libseccomp's version and API
    level are what ctypes reads."""
    out = subprocess.run([sys.executable, "-c", THE_HELPERS_KERNEL_CALLS], cwd=tmp_path, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                         text=True).stdout.splitlines()
    missing, ours, dumpable, mount_errno, before, after, theirs = out
    assert missing == "None"
    assert dumpable == "1"
    assert mount_errno in ("1", "2")        # EPERM (not root), ENOENT (root)
    assert (before, after) == ("False", "True")
    (major, minor, micro), api = eval(theirs)       # noqa: S307 - our own printout
    assert ours == f"(_Version(major={major}, minor={minor}, micro={micro}), {api})"

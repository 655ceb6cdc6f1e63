"""`vpnw doctor` checks: all pass here; with user namespaces exhausted, guard cannot work."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stages.orchestrator.doctor import guard_can_work, run_checks

DOCTOR = "from stages.orchestrator.doctor import doctor_command; doctor_command(['--json'])"


def test_checks_have_known_statuses_and_guard_works_here():
    checks = run_checks()
    assert {c.status for c in checks} <= {"ok", "warn", "fail"}
    assert {"kernel", "namespaces", "seccomp", "libseccomp", "io_uring", "unix_sockets"} <= \
        {c.name for c in checks}
    # This machine has what the Unix-socket supervisor needs (Linux 6.18, libseccomp 2.5).
    assert next(c for c in checks if c.name == "unix_sockets").status == "ok"
    if subprocess.run(["unshare", "-Urn", "true"], capture_output=True).returncode != 0:
        pytest.skip("this machine cannot create user namespaces")
    assert guard_can_work(checks), checks


def test_doctor_fails_when_user_namespaces_are_exhausted():
    script = f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} -c \"{DOCTOR}\""
    proc = subprocess.run(["unshare", "-U", "-r", "--fork", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60, cwd="/")
    if "Operation not permitted" in proc.stderr:
        pytest.skip("cannot create the nested namespace for this test")
    checks = {c["name"]: c for c in map(json.loads, proc.stdout.splitlines())}
    assert proc.returncode == 1, proc.stderr
    assert checks["max_user_namespaces"]["status"] == "fail"
    assert checks["namespaces"]["status"] == "fail" and checks["namespaces"]["fix"]

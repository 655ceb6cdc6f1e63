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


# ── checked always: what WireGuard needs, and the Node on PATH (issue 28) ──

def _path_with(tmp_path, **programs: str) -> str:
    """A PATH of one directory holding the given shell scripts."""
    for name, body in programs.items():
        script = tmp_path / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    return str(tmp_path)


def test_wireguard_go_and_tun_are_checked_without_a_paths_file(monkeypatch, tmp_path):
    from stages.orchestrator.doctor import check_wireguard_support
    names = [c.name for c in run_checks()]
    assert "wireguard-go" in names and "tun" in names, names
    # Missing wireguard-go: a warning when no paths file needs it, a failure when one does.
    monkeypatch.setenv("PATH", _path_with(tmp_path))
    alone, = [c for c in check_wireguard_support() if c.name == "wireguard-go"]
    needed, = [c for c in check_wireguard_support(needed=True) if c.name == "wireguard-go"]
    assert (alone.status, needed.status) == ("warn", "fail")
    assert "WireGuard paths exit 123" in alone.detail and "apt-get install wireguard-go" in alone.fix


def test_a_wireguard_path_in_the_paths_file_makes_the_checks_needed(tmp_path):
    from stages.orchestrator.doctor import config_names_wireguard
    wg = tmp_path / "wg.conf"
    wg.write_text("[Interface]\nPrivateKey = x\n")
    office = tmp_path / "office.toml"
    office.write_text(f'version = 1\nname = "o"\n\n[paths.office]\ntype = "wireguard"\nconf = "{wg}"\n')
    proxy = tmp_path / "proxy.toml"
    proxy.write_text('version = 1\nname = "p"\n\n[paths.exit]\ntype = "proxy"\nurl = "socks5h://10.8.0.1:1080"\n')
    assert config_names_wireguard(str(office)) and not config_names_wireguard(str(proxy))
    assert not config_names_wireguard(str(tmp_path / "missing.toml"))


@pytest.mark.parametrize("version, status", [("v20.20.2", "warn"), ("v22.20.0", "warn"),
                                             ("v22.21.0", "ok"), ("v23.11.1", "warn"),
                                             ("v24.0.0", "ok"), ("v26.1.0", "ok")])
def test_a_node_older_than_22_21_is_noted(monkeypatch, tmp_path, version, status):
    from stages.orchestrator.doctor import check_node
    monkeypatch.setenv("PATH", _path_with(tmp_path, node=f"echo {version}"))
    check = check_node()
    assert check.name == "node" and check.status == status, check
    if status == "warn":
        assert "older than 22.21" in check.detail and "NODE_USE_ENV_PROXY" in check.detail
        assert check.fix == "use Node 22.21 or newer"


def test_no_node_is_no_warning(monkeypatch, tmp_path):
    from stages.orchestrator.doctor import check_node
    monkeypatch.setenv("PATH", _path_with(tmp_path))
    assert check_node().status == "ok"


def test_text_is_wrapped_to_the_terminal_and_only_there():
    from stages.orchestrator.doctor import Check, render
    check = Check("capture", "warn", "word " * 30 + "/a/very/long/path/that/is/never/cut/" * 3, "fix it")
    assert "\n" not in render(check, None)
    rows = render(check, 60).splitlines()
    assert len(rows) > 2 and rows[0].startswith("warn  capture  word")
    assert all(row.startswith(" " * 6) for row in rows[1:])
    long_word = "/a/very/long/path/that/is/never/cut/" * 3
    assert any(row.strip() == long_word for row in rows), rows
    assert all(len(row) <= 60 for row in rows if long_word not in row)

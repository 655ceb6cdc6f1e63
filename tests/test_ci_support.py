"""tests/ci_support.py: under CI a test the README's tables rely on
(marked readme_table) fails rather than skips, however it was skipped, and
so does one whose `needs` mark finds its tool missing; a test without the
marks skips as usual; outside CI all skip."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from progs_support import prog_text

TESTS = Path(__file__).resolve().parent

SAMPLE = prog_text("ci_sample_tests.py")


def run_sample(tmp_path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(TESTS)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "ci_support", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "-q", "-rsfE", str(tmp_path / "test_sample.py")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_everything_skips(tmp_path, ci):
    r = run_sample(tmp_path, ci)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 6 skipped" in r.stdout, r.stdout


def test_under_ci_a_readme_table_test_fails_however_it_skipped(tmp_path):
    r = run_sample(tmp_path, "true")
    assert r.returncode == 1, r.stdout + r.stderr
    # A skip in the test's call is a failure, one in its setup (skipif, a fixture) an error.
    failed = sorted(line.split("::")[1].split()[0] for line in r.stdout.splitlines()
                    if line.startswith(("FAILED", "ERROR")))
    assert failed == ["test_cannot_outside_the_table", "test_needs_what_is_missing",
                      "test_table_skip_in_a_fixture", "test_table_skip_in_the_test",
                      "test_table_skipif"], r.stdout
    assert "1 passed" in r.stdout and "1 skipped" in r.stdout and "legacy_tiocsti is 0" in r.stdout, r.stdout
    assert "minisign is not installed (CI: scripts/setup should have installed it)" in r.stdout, r.stdout
    assert "the README's tables rely on this test: chromium is not installed" in r.stdout, r.stdout


def test_the_readme_tables_tests_carry_the_mark():
    """The agents' table and the clients' table: each row's tests are marked."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                        "--collect-only", "-q", "-m", "readme_table",
                        "tests/test_agents.py", "tests/test_e2e_clients.py", "tests/test_e2e_everyday.py",
                        "tests/test_e2e_git_ssh.py"],
                       capture_output=True, text=True, cwd=TESTS.parent, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    marked = {line.split("::")[1].split("[")[0] for line in r.stdout.splitlines() if "::" in line}
    for name in ("test_node_fetch", "test_node_through_both_doors", "test_pip_install_from_the_worlds_index",
                 "test_npm_install_from_the_worlds_registry",
                 "test_java_fetches_through_the_doors_with_no_proxy_flags",
                 "test_plain_ssh_and_scp_with_the_documented_proxy_command",
                 "test_codex_cli_draws_reads_keys_and_round_trips",
                 "test_headless_chromium_fetches_through_the_door_and_round_trips",
                 "test_headless_agent_asks_its_api_host_and_round_trips"):
        assert name in marked, (name, sorted(marked))
    assert "test_daily_use_install_from_a_fresh_clone" not in marked


def test_scripts_test_carries_ci_through_sudo():
    """As a user, scripts/test runs itself again under sudo, which resets the
    environment: CI (and the VPNW_ settings that choose the venv, the
    workers and the start-up tricks) go along on sudo's command line. A stand-in sudo prints what it
    was given."""
    import shutil
    import tempfile
    where = Path(tempfile.mkdtemp(prefix="vpnw-sudo-"))
    try:
        (where / "scripts").mkdir()
        shutil.copy(TESTS.parent / "scripts" / "test", where / "scripts" / "test")
        (where / "bin").mkdir()
        (where / "bin" / "sudo").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
        for path in (where, where / "scripts", where / "bin"):
            path.chmod(0o755)
        (where / "bin" / "sudo").chmod(0o755)
        env = {"PATH": f"{where / 'bin'}:/usr/bin:/bin", "CI": "true", "VPNW_VENV": "/opt/some-venv",
               "VPNW_TEST_WORKERS": "1", "VPNW_STARTUP_TRICKS": "off"}
        as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
        r = subprocess.run([*as_user, str(where / "scripts" / "test"), "-k", "world"], capture_output=True,
                           text=True, env=env, cwd=where, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.splitlines() == ["--", "env", "CI=true", "VPNW_VENV=/opt/some-venv",
                                         "VPNW_TEST_WORKERS=1", "VPNW_STARTUP_TRICKS=off",
                                         str(where / "scripts" / "test"),
                                         "-k", "world"], r.stdout
    finally:
        shutil.rmtree(where)

"""Ubuntu 23.10 and later (kernel.apparmor_restrict_unprivileged_userns = 1):
`vpnw doctor --apparmor-profile` writes the profile that lets the installed
vpnw make user namespaces, apparmor_parser (Debian's `apparmor`) accepts it,
and `vpnw doctor` names the one root step that installs it when the sysctl
is 1 and no profile covers vpnw. In the test world, as root and as the
unprivileged user; the sysctl is a file of our own over /proc/sys/kernel in
a mount namespace of the doctor's own (this machine has no AppArmor)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from ci_support import needs
from e2e_support import describe
from progs_support import prog_text
from stages.orchestrator import apparmor

PARSER = shutil.which("apparmor_parser") or "/usr/sbin/apparmor_parser"


def parser_version() -> tuple[int, ...]:
    out = subprocess.run([PARSER, "--version"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"version (\d+)\.(\d+)", out)
    return tuple(map(int, found.groups())) if found else (0, 0)


def parse(tmp_path, text: str) -> subprocess.CompletedProcess:
    """apparmor_parser's whole check of `text`, loading nothing."""
    profile = tmp_path / "vpnw-profile"
    profile.write_text(text)
    return subprocess.run([PARSER, "--skip-kernel-load", "--skip-cache", str(profile)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.world
@needs(not os.access(PARSER, os.X_OK), "apparmor_parser is missing (scripts/setup installs Debian's apparmor)")
def test_the_profile_names_the_installed_launcher_and_apparmor_parser_accepts_it(world, user, tmp_path):
    r = world.vpnw(["doctor", "--apparmor-profile"], user=user)
    assert r.returncode == 0, describe(r)
    launcher = os.path.realpath(world.vpnw_path)
    assert f'profile {apparmor.profile_name(launcher)} "{launcher}" flags=(unconfined) {{\n  userns,\n}}\n' \
        in r.stdout, r.stdout
    if parser_version() >= (4, 0):
        checked = parse(tmp_path, r.stdout)
    else:
        # AppArmor 3 (Debian 12) has neither the `userns` rule nor the 4.0
        # ABI; everything else of the profile is checked as written.
        older = r.stdout.replace("abi <abi/4.0>,\n", "abi <abi/3.0>,\n", 1).replace("  userns,\n", "", 1)
        assert older.count("\n") == r.stdout.count("\n") - 1
        checked = parse(tmp_path, older)
        control = parse(tmp_path, older.replace("flags=(unconfined) {\n", "flags=(unconfined) {\n  nonsense,\n"))
        assert control.returncode != 0, "the parser accepted a rule it does not know"
    assert checked.returncode == 0, checked.stdout + checked.stderr


FAKE_SYSCTL = prog_text("fake_apparmor_sysctl.py")


def doctor_with_the_sysctl(world, user: str, value: str):
    """`vpnw doctor --json` as `user`, seeing the sysctl at `value`: a tmpfs
    of our own over /proc/sys/kernel in a new mount namespace (for the
    unprivileged user, in a user namespace mapping it to itself, with the
    capabilities mount needs kept for the mount and dropped before the doctor)."""
    script = world.file("fake_apparmor_sysctl.py", FAKE_SYSCTL)
    unshare = ["unshare", "-m"] if user == "root" else ["unshare", "--map-current-user", "--keep-caps", "-m"]
    r = world.run([*unshare, "python3", str(script), value, str(world.vpnw_path), "doctor", "--json"],
                  user=user, timeout=120)
    checks = {c["name"]: c for c in map(json.loads, r.stdout.splitlines())} if r.stdout else {}
    return r, checks


@pytest.mark.world
def test_doctor_names_the_root_step_when_apparmor_restricts_user_namespaces(world, user):
    r, checks = doctor_with_the_sysctl(world, user, "1")
    assert r.returncode == 1, describe(r)           # guard cannot work here: the sandbox needs it
    check = checks["apparmor_userns"]
    assert check["status"] == "fail", check
    assert "kernel.apparmor_restrict_unprivileged_userns = 1" in check["detail"], check
    assert check["fix"] == apparmor.install_step(user), check
    assert check["fix"] == (f"vpnw doctor --apparmor-profile | sudo tee /etc/apparmor.d/vpnw-{user} "
                            f">/dev/null && sudo apparmor_parser -r /etc/apparmor.d/vpnw-{user}")
    # Control: the same doctor, the sysctl at 0, says nothing of AppArmor and passes.
    r, checks = doctor_with_the_sysctl(world, user, "0")
    assert r.returncode == 0, describe(r)
    assert "apparmor_userns" not in checks, checks


@pytest.mark.parametrize("label, status", [
    ("unconfined", "fail"), (None, "fail"),
    ("vpnw-3bada49221d5 (unconfined)", "ok"),
    ("snap.code.code (enforce)", "warn")])
def test_the_verdict_under_the_restriction(label, status):
    found = apparmor.verdict("1", label, "alice")
    assert found[0] == status, found
    assert found[2] == ("" if status == "ok" else apparmor.install_step("alice"))


@pytest.mark.parametrize("restricted", [None, "0", ""])
def test_no_verdict_where_nothing_is_restricted(restricted):
    assert apparmor.verdict(restricted, "unconfined", "alice") is None


@pytest.mark.parametrize("path", ["bin/vpnw", "/opt/v*/bin/vpnw", "/home/a/@{HOME}/vpnw", '/x"y/vpnw',
                                  "/a\nb/vpnw", "/a,b/vpnw"])
def test_a_path_apparmor_cannot_name_exactly_is_refused(path):
    with pytest.raises(apparmor.ProfileProblem, match="AppArmor can name exactly"):
        apparmor.profile_text(path)


def test_one_name_per_launcher():
    assert apparmor.profile_name("/opt/a/bin/vpnw") != apparmor.profile_name("/opt/b/bin/vpnw")
    assert re.fullmatch(r"vpnw-[0-9a-f]{12}", apparmor.profile_name("/opt/a/bin/vpnw"))

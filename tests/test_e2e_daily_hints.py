"""What vpnw says at the end of a run, as a person at a terminal sees it
(issue 45), in the test world, as root and as the unprivileged user: no hint
after the person stopped the program with Ctrl-C, whatever it met before."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.world

# One direct try the sandbox refuses (no route: it is not a door), then the program waits.
TRY_THEN = "bash -c 'echo > /dev/tcp/10.7.0.1/80; echo tried-once; {then}'"


@pytest.mark.parametrize("ending", ["ctrl-c", "own-exit"])
def test_no_hint_after_ctrl_c(world, term, ending):
    then = "sleep 300" if ending == "ctrl-c" else "exit 7"
    mark = term.start(f"{term.vpnw} run -- {TRY_THEN.format(then=then)}")
    term.wait_for(r"^tried-once", whole=True)
    if ending == "ctrl-c":
        term.keys("C-c")
        assert term.finished(mark) == 130
        # The summary is there; no hint blames the refused try for the person's Ctrl-C.
        history = term.history()
        assert "vpnw  run r-" in history, history
        assert "hint:" not in history, history
    else:   # the control: the same try, the program's own failure, gets the hint
        assert term.finished(mark) == 7
        term.wait_for(r"vpnw: hint: the program exited 7 after 1 try at a way out other than "
                      r"vpnw's doors", whole=True)


# ── a socket that runs commands is never offered to [unix] allow ────────────

def test_a_refused_tmux_socket_is_not_blamed_nor_offered(world, term):
    """Claude Code in tmux, as met: the program tries the tmux server's socket
    (refused), then fails for another reason (a connection refused) and exits
    1. The hint names that connection; the socket is said to stay refused."""
    tt = term.work / "tt"
    assert term.run(f"mkdir -m 700 {tt} && TMUX_TMPDIR={tt} tmux -f /dev/null new-session -d "
                    f"-s bg 'sleep 600'") == 0
    try:
        # The control: outside the sandbox the socket runs a command for whoever connects.
        outside, inside = term.work / "ran-outside", term.work / "ran-inside"
        assert term.run(f"TMUX_TMPDIR={tt} tmux run-shell 'touch {outside}'") == 0
        assert outside.exists()
        program = (f"sh -c 'TMUX_TMPDIR={tt} tmux run-shell \"touch {inside}\"; "
                   f"curl -sS -o /dev/null http://203.0.113.5:9/; exit 1'")
        assert term.run(f"{term.vpnw} run -- {program}") == 1
        assert not inside.exists(), "the tmux server ran a command for the sandboxed program"
        term.wait_for(r"vpnw: hint: the program exited 1 after its connection to 203\.0\.113\.5:9 "
                      r"failed", whole=True)
        term.wait_for(r"vpnw: note: the sandbox refused the program the Unix socket \S+/tmux-\d+/"
                      r"default: tmux's server, which runs commands outside the sandbox for whoever "
                      r"connects, so it stays refused \(never name it in \[unix\] allow\)", whole=True)
        assert "[unix] allow can name it" not in term.history(), term.history()
    finally:
        term.run(f"TMUX_TMPDIR={tt} tmux kill-server")


# ── file limits are said even when the program succeeds ─────────────────────

def test_file_limits_are_said_at_the_start_of_a_trace_and_after_a_run_that_succeeded(world, term):
    policy = term.work / "limits.toml"
    policy.write_text('version = 1\nname = "limits"\n[policy]\ndefault = "allow"\n'
                      '[files]\ndeny_read = ["~/.ssh"]\nallow_write = ["."]\n')
    # The program meets the limit and goes on: it exits 0 all the same.
    program = "sh -c 'touch $HOME/planted 2>/dev/null || echo met-the-limit; exit 0'"
    assert term.run(f"{term.vpnw} trace --policy {policy} -- {program}") == 0
    history = term.history()
    assert "met-the-limit" in history, history
    start = term.wait_for(r"^vpnw \S+  files: the \[files\] table of (\S+) hid (.*)$", whole=True)
    assert start.group(1) == str(policy) and "/.ssh" in start.group(2), history
    assert "made everything read-only but" in start.group(2), history
    term.wait_for(r"^vpnw: note: the program ran under the \[files\] table of \S+limits\.toml, which "
                  r"hid \S+/\.ssh", whole=True)
    # run and guard say it at the end too.
    mark = term.start(f"{term.vpnw} guard --policy {policy} -- true")
    assert term.finished(mark) == 0
    assert term.history().count("vpnw: note: the program ran under the [files] table") == 2


def test_a_policy_that_allows_a_command_socket_is_said_at_the_start(world, user):
    uid = 0 if user == "root" else __import__("pwd").getpwnam(user).pw_uid
    sock = f"/tmp/tmux-{uid}/default"
    policy = world.file(f"daily-unix-{user}.toml", 'version = 1\nname = "u"\n[policy]\n'
                        f'default = "allow"\n[unix]\nallow = ["{sock}"]\n')
    r = world.vpnw(["guard", "--policy", str(policy), "--", "true"], user=user)
    assert r.returncode == 0, r.stderr
    assert (f"note: [unix] allow names {sock} (tmux's server), which runs commands outside the "
            "sandbox for whoever connects") in r.stderr, r.stderr
    # The control: a socket that runs nothing is not said.
    policy = world.file(f"daily-unix-pg-{user}.toml", 'version = 1\nname = "u"\n[policy]\n'
                        'default = "allow"\n[unix]\nallow = ["/run/postgresql/.s.PGSQL.5432"]\n')
    r = world.vpnw(["guard", "--policy", str(policy), "--", "true"], user=user)
    assert r.returncode == 0 and "note:" not in r.stderr, r.stderr

"""vpnw on a real terminal (tmux), as root and as the unprivileged user.

The program gets a pty of its own (docs/architecture.md, "The terminal"): /dev/tty
works inside, full-screen programs and line editors work, Ctrl-Z and `fg`
move vpnw and the program together, the user's terminal mode is the same
after a run however it ends, window-size changes reach the program, and
nothing the program does to its terminal reaches a process outside. vpnw's
own lines never cut one of the program's. Each test types in a tmux pane
whose shell runs in the test world, and where it makes sense runs the same
thing outside vpnw as a control.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ci_support import needs
from e2e_support import describe
from progs_support import prog_text
from stages.record.check import check_run
from tmux_support import PROMPT, wait_file

pytestmark = pytest.mark.world

SYSTEM_PYTHON = "/usr/bin/python3"


def write(world, term, name: str, text: str) -> str:
    """A file in the pane user's work directory (readable by that user)."""
    path = world.file(f"{term.work.name}-{name}", text)
    return str(path)


def run_files(term) -> list:
    return sorted((term.state_home / "vpnw" / "runs").glob("*.jsonl"))


def last_record(term) -> list[dict]:
    files = run_files(term)
    assert files, "no run file"
    events = [json.loads(line) for line in files[-1].read_text().splitlines()]
    assert check_run(events) == [], check_run(events)
    return events


# ── a passphrase through /dev/tty is never shown ────────────────────────

GETPASS = r'''
import getpass, sys
secret = getpass.getpass("Secret: ")   # opens /dev/tty, echo off
print("got", len(secret), "characters")
'''


@pytest.mark.parametrize("where", ["vpnw", "outside"])
def test_passphrase_through_dev_tty_is_not_echoed(world, term, where):
    prefix = f"{term.vpnw} run -- " if where == "vpnw" else ""
    key = term.work / f"key-{where}"
    mark = term.start(f"{prefix}ssh-keygen -q -t ed25519 -C t -f {key}")
    term.wait_for(r"Enter passphrase")
    term.type("Hunter2Sekrit")
    term.keys("Enter")
    term.wait_for(r"Enter same passphrase again")
    term.type("Hunter2Sekrit")
    term.keys("Enter")
    # Keys typed before the run ends are the program's: wait for the shell.
    assert term.finished(mark) == 0
    assert key.with_suffix(".pub").exists()
    program = write(world, term, "getpass.py", GETPASS)
    mark = term.start(f"{prefix}{SYSTEM_PYTHON} {program}")
    term.wait_for(r"Secret:\s*$", whole=True)   # (a wrapped typed line may join it)
    term.type("Hunter3Other")
    term.keys("Enter")
    assert term.finished(mark) == 0
    term.wait_for(r"^got 12 characters", whole=True)
    shown = term.history()
    assert "Hunter2Sekrit" not in shown and "Hunter3Other" not in shown, shown
    assert "Warning: Password input may be echoed" not in shown, shown
    if where == "vpnw":
        assert "Can't open /dev/tty" not in shown, shown


# ── full-screen programs and line editors ───────────────────────────────

# Each runs under vpnw and, as the control, the same way outside it.
BOTH = pytest.mark.parametrize("where", ["vpnw", "outside"])


def under(term, where: str) -> str:
    return f"{term.vpnw} run -- " if where == "vpnw" else ""


def ended(term, where: str, mark: int, code: int) -> None:
    assert term.finished(mark) == code
    if where == "vpnw":
        term.wait_for(rf"^vpnw  run r-\S+: .*exit {code};", whole=True)


@BOTH
def test_less_pages_a_file(world, term, where):
    path = write(world, term, "numbers.txt", "".join(f"line {i:03d}\n" for i in range(1, 301)))
    mark = term.start(f"{under(term, where)}less {path}")
    term.wait_for(r"^line 001$")
    assert "line 040" not in term.screen()
    term.keys("Space")
    term.wait_for(r"^line 040$")
    term.keys("G")
    term.wait_for(r"^line 300$")
    term.keys("q")
    ended(term, where, mark, 0)


@BOTH
def test_vi_opens_and_saves_a_file(world, term, where):
    target = term.work / "notes.txt"
    mark = term.start(f"{under(term, where)}vi {target}")
    term.wait_for(r'^".*notes\.txt" \[New')    # vi's own status line, not the typed command
    term.keys("i")
    term.type(f"written {where}")
    term.keys("Escape")
    term.type(":wq")
    term.keys("Enter")
    ended(term, where, mark, 0)
    assert target.read_text() == f"written {where}\n"


@BOTH
def test_python_repl_edits_a_line(world, term, where):
    mark = term.start(f"{under(term, where)}{SYSTEM_PYTHON} -q")
    term.wait_for(r"^>>> $")
    term.line("word = 'terminal'")
    # Type a mistake, move left over it and fix it: readline must see the keys.
    term.type("print(word.upperXX())")
    term.keys("Left", "Left", "Left", "BSpace", "BSpace")
    term.keys("Enter")
    term.wait_for(r"^TERMINAL$")
    term.keys("Up")                       # history
    term.wait_for(r">>> print\(word\.upper\(\)\)$")
    term.keys("C-u")
    term.keys("C-d")
    ended(term, where, mark, 0)


@BOTH
def test_bash_inside_has_job_control(world, term, where):
    mark = term.start(f"{under(term, where)}bash --norc --noprofile -i")
    term.wait_for(r"^\$ $")
    term.line("PS1='inner> '")
    term.wait_for(r"^inner> $")
    term.line("sleep 100 &")
    term.line("jobs")
    term.wait_for(r"^\[1\]\+\s+Running\s+sleep 100 &")
    term.line("fg")
    term.wait_for(r"^sleep 100$")
    term.keys("C-z")
    term.wait_for(r"^\[1\]\+\s+Stopped\s+sleep 100")
    term.line("kill -KILL %1; while jobs %1 >/dev/null 2>&1; do sleep 0.1; done; exit 3")
    ended(term, where, mark, 3)
    shown = term.history()
    assert "no job control" not in shown and "cannot set terminal process group" not in shown, shown


@needs(shutil.which("node") is None, "node is not installed (scripts/setup installs Debian's nodejs)")
@BOTH
def test_node_repl(world, term, where):
    mark = term.start(f"{under(term, where)}node")
    term.wait_for(r"^> $")
    term.line("[1, 2, 3].map(x => x * 14).join('-')")
    term.wait_for(r"^'14-28-42'$")
    term.line(".exit")
    ended(term, where, mark, 0)


# ── job control and the user's terminal mode ────────────────────────────

def test_ctrl_z_suspends_vpnw_and_the_program_and_fg_resumes_both(world, term):
    term.line(f"{term.vpnw} run -- {SYSTEM_PYTHON} -q")
    term.wait_for(r"^>>> $")
    term.line("kept = 6 * 7")
    # Ctrl-Z flushes the terminal's unread input: wait until Python has the line.
    term.wait_for(r"^>>> kept = 6 \* 7\n>>> $")
    term.keys("C-z")
    term.wait_for(r"^\[1\]\+\s+Stopped\s+.*vpnw run")
    # The shell has the terminal back, in its own mode: a command runs.
    assert term.run("echo shell-$((2+3))") == 0
    term.wait_for(r"^shell-5$")
    term.line("fg")
    term.line("print('kept', kept)")
    term.wait_for(r"^kept 42$")
    term.keys("C-d")
    term.wait_for(r"^vpnw  run r-\S+: .*exit 0", whole=True)
    assert term.run("true") == 0


RAW_THEN_DIE = prog_text("raw_then_die.py")


def _vpnw_pid(term) -> int:
    """The vpnw the pane's shell runs now (its child), found through /proc."""
    shell = int(term._tmux("display-message", "-p", "-t", "t", "#{pane_pid}").strip())
    end = time.monotonic() + 60
    while time.monotonic() < end:
        for task in os.listdir(f"/proc/{shell}/task"):
            with open(f"/proc/{shell}/task/{task}/children") as f:
                for child in f.read().split():
                    with open(f"/proc/{child}/cmdline", "rb") as c:
                        # python [-I] .../bin/vpnw ...: the script is the
                        # interpreter's first argument that is not an option
                        args = c.read().split(b"\0")[1:]
                        script = next((a for a in args if not a.startswith(b"-")), b"")
                        if b"vpnw" in script:
                            return int(child)
        time.sleep(0.05)
    raise AssertionError("no vpnw under the pane's shell")


@pytest.mark.parametrize("ending", ["exit", "sigkill", "ctrl-c", "ctrl-backslash", "sigterm-to-vpnw"])
def test_terminal_mode_identical_after_a_run(world, term, ending):
    program = write(world, term, "raw_then_die.py", RAW_THEN_DIE)
    before, after = term.work / "before", term.work / "after"
    assert term.run(f"stty -a > {before}") == 0
    if ending == "exit":
        assert term.run(f"{term.vpnw} run -- {SYSTEM_PYTHON} {program} exit") == 0
    elif ending == "sigkill":
        assert term.run(f"{term.vpnw} run -- {SYSTEM_PYTHON} {program} kill") == 137
    else:
        term.line(f"{term.vpnw} run -- {SYSTEM_PYTHON} -c "
                  "\"import time, tty; tty.setcbreak(0); print('sleeping', flush=True); time.sleep(600)\"")
        term.wait_for(r"^sleeping")
        if ending == "ctrl-c":
            term.keys("C-c")
            expected = 130
        elif ending == "ctrl-backslash":
            term.keys("C-\\")
            expected = 131
        else:
            os.kill(_vpnw_pid(term), signal.SIGTERM)   # forwarded to the program, as before
            expected = 143
        term.wait_for(rf"^vpnw  run r-\S+: .*exit {expected}", whole=True)
    assert term.run(f"stty -a > {after}") == 0
    assert wait_file(after) == before.read_text()


def test_control_a_program_killed_outside_vpnw_leaves_the_terminal_raw(world, term):
    """The control for the test above: the same program run directly
    changes the terminal and leaves it so. (It exits rather than die by
    SIGKILL here: bash itself repairs the terminal after a job killed by a
    signal; vpnw exits 137, which bash does not treat so.)"""
    program = write(world, term, "raw_then_die.py", RAW_THEN_DIE)
    before, after = term.work / "before", term.work / "after"
    assert term.run(f"stty -a > {before}") == 0
    term.line(f"{SYSTEM_PYTHON} {program} exit; stty -a > {after}; stty sane")
    text = wait_file(after, lambda t: "speed" in t)
    assert text != before.read_text()
    echo_off = re.compile(r"(^|\s)-echo(\s|$)", re.M)
    assert echo_off.search(text) and not echo_off.search(before.read_text())


# ── window size and signals from the program's terminal ─────────────────

SIZE_WATCHER = prog_text("size_watcher.py")


def test_resizing_the_window_reaches_the_program(world, term):
    program = write(world, term, "size_watcher.py", SIZE_WATCHER)
    term.line(f"{term.vpnw} run -- {SYSTEM_PYTHON} {program}")
    term.wait_for(r"^size 100x30$")
    term.resize(77, 21)
    term.wait_for(r"^size 77x21$")
    term.resize(120, 40)
    term.wait_for(r"^size 120x40$")
    term.keys("Enter")
    term.wait_for(r"^vpnw  run r-\S+: .*exit 0", whole=True)
    assert term.run("stty size") == 0
    term.wait_for(r"^40 120$")


# Runs a command in the same process group as itself (the terminal's
# foreground group, as vpnw would be) and counts the SIGWINCH and SIGTTOU...
# that reach it while the command runs.
SIGNAL_COUNTER = prog_text("signal_counter.py")

# The program's terminal calls: a new window size (the kernel sends SIGWINCH
# to the terminal's foreground group) on every terminal it can reach.
TERMINAL_CALLS = prog_text("terminal_calls.py")


@pytest.mark.parametrize("where", ["vpnw", "outside"])
def test_no_process_outside_gets_a_signal_from_the_programs_terminal(world, term, where):
    counter = write(world, term, "signal_counter.py", SIGNAL_COUNTER)
    calls = write(world, term, "terminal_calls.py", TERMINAL_CALLS)
    out = term.work / f"seen-{where}.json"
    prefix = [term.vpnw, "run", "--"] if where == "vpnw" else []
    command = " ".join([SYSTEM_PYTHON, counter, str(out), *prefix, SYSTEM_PYTHON, calls])
    assert term.run(command) == 0
    term.wait_for(r"^resized 3$", whole=True)
    seen = json.loads(wait_file(out))
    if where == "vpnw":
        assert seen == {"code": 0, "seen": {}}, seen
        # The user's window keeps its size.
        assert term.run("stty size") == 0
        term.wait_for(r"^30 100$")
    else:
        assert seen["seen"].get("SIGWINCH", 0) >= 1, seen
        term.line("stty rows 30 cols 100")


TIOCSTI_PROGRAM = prog_text("tiocsti.py")


def test_tiocsti_is_refused_on_the_programs_pty(world, term):
    program = write(world, term, "tiocsti.py", TIOCSTI_PROGRAM)
    assert term.run(f"{term.vpnw} run -- {SYSTEM_PYTHON} {program}") == 0
    shown = term.history()
    assert re.search(r"^refused /dev/tty EPERM$", shown, re.M), shown
    assert re.search(r"^refused fd 0 EPERM$", shown, re.M), shown
    assert re.search(r"^tioclinux EPERM$", shown, re.M), shown
    assert "injected" not in shown


def _legacy_tiocsti() -> bool:
    try:
        with open("/proc/sys/dev/tty/legacy_tiocsti") as f:
            return f.read().strip() == "1"
    except OSError:
        return True   # kernels before 6.2 have no switch: TIOCSTI is allowed


def test_control_tiocsti_works_outside(world, term, user):
    """The control: outside vpnw the same calls inject, and TIOCLINUX gets the
    kernel's own answer for a pty (so EPERM above is the filter's)."""
    if user != "root" and not _legacy_tiocsti():
        pytest.skip("dev.tty.legacy_tiocsti is 0: outside, only CAP_SYS_ADMIN may inject")
    program = write(world, term, "tiocsti.py", TIOCSTI_PROGRAM)
    term.line(f"{SYSTEM_PYTHON} {program}")
    term.wait_for(r"injected /dev/tty$", whole=True)
    found = term.wait_for(r"^tioclinux (\w+)$", whole=True)
    assert found.group(1) != "EPERM"
    term.keys("C-u")


# The identity of a terminal's name, and whether it can be opened and written.
OTHER_TERMINAL = prog_text("other_terminal.py")


@pytest.mark.parametrize("where", ["vpnw", "outside"])
def test_the_users_other_terminals_are_not_there_inside(world, term, user, where):
    """Another terminal of the user's (a pty it owns, as its other windows
    are) cannot be opened by name inside: the sandbox has a devpts of its own.
    The control: outside, the same program opens and writes it."""
    import pwd
    master, slave = os.openpty()
    try:
        path = os.ttyname(slave)
        os.chown(path, pwd.getpwnam(user).pw_uid, -1)
        st = os.stat(path)
        program = write(world, term, "other_terminal.py", OTHER_TERMINAL)
        prefix = f"{term.vpnw} run -- " if where == "vpnw" else ""
        assert term.run(f"{prefix}{SYSTEM_PYTHON} {program} {path}") == 0
        seen = json.loads(term.wait_for(r"^SEEN (.*)$", whole=True).group(1))
        if where == "vpnw":
            assert seen["stat"] != [st.st_dev, st.st_ino], seen
            assert seen["own"].startswith("/dev/pts/"), seen
            assert set(seen["entries"]) <= {"ptmx", seen["own"].rsplit("/", 1)[1]}, seen
        else:
            assert seen["stat"] == [st.st_dev, st.st_ino] and seen["opened"], seen
    finally:
        os.close(master)
        os.close(slave)


# ── vpnw's lines never cut the program's ────────────────────────────────

# Many connections at once (each one a trace line or three) while the main
# thread prints long lines, each written in several pieces.
LONG_LINES = prog_text("long_lines.py")


def test_trace_lines_never_split_the_programs_long_lines(world, term):
    program = write(world, term, "long_lines.py", LONG_LINES)
    term.line(f"{term.vpnw} trace -- {SYSTEM_PYTHON} {program} 40")
    term.wait_for(r"^vpnw \S+\s+run r-\S+: 120 connections.*exit 0", whole=True, timeout=180)
    lines = term.history().splitlines()
    program_lines = [ln for ln in lines if re.match(r"^L\d{4}:", ln)]
    assert len(program_lines) == 200, [ln for ln in lines if "L0" in ln][:5]
    whole = re.compile(r"^L\d{4}:" + "x" * 240 + ":END$")
    broken = [ln for ln in program_lines if not whole.match(ln)]
    assert not broken, broken[:3]
    vpnw_lines = [ln for ln in lines if "vpnw " in ln and not ln.startswith(PROMPT)]
    assert len([ln for ln in vpnw_lines if " open " in ln]) == 120
    assert all(ln.startswith("vpnw ") for ln in vpnw_lines), \
        [ln for ln in vpnw_lines if not ln.startswith("vpnw ")][:3]


def test_a_prompt_without_newline_does_not_hold_vpnws_lines(world, term):
    """A program that asks a question and waits: vpnw's DENY line comes out
    on a line of its own, and the prompt is shown again, whole, below it."""
    policy = write(world, term, "deny.toml",
                   'version = 1\nname = "t"\n[policy]\ndefault = "deny"\nallow = ["nothing.test"]\n')
    prompt = ("import urllib.request, sys\n"
              "sys.stdout.write('Continue? [y/N] '); sys.stdout.flush()\n"
              "try:\n    urllib.request.urlopen('http://api.github.com/', timeout=30)\n"
              "except Exception:\n    pass\n"
              "print('answer', sys.stdin.readline().strip())\n")
    program = write(world, term, "prompt.py", prompt)
    term.line(f"{term.vpnw} guard --policy {policy} -- {SYSTEM_PYTHON} {program}")
    term.wait_for(r"^vpnw \S+\s+#1\s+DENY\s+api\.github\.com:80")
    term.wait_for(r"^Continue\? \[y/N\] $")
    term.type("y")
    term.keys("Enter")
    term.wait_for(r"^answer y$")
    term.wait_for(r"exit 120", whole=True)
    shown = term.history()
    assert not re.search(r"Continue\? \[y/N\] vpnw", shown), shown


# Without a terminal: the program's long stderr lines in pieces, many
# connections at once; each of vpnw's lines is one write, never cut.
def test_without_a_terminal_vpnws_lines_are_whole(world, user):
    program = world.file(f"stderr_pieces-{user}.py", LONG_LINES)
    r = world.vpnw(["trace", "--", SYSTEM_PYTHON, str(program), "20", "stderr"], user=user, timeout=180)
    assert r.returncode == 0, describe(r)
    human = re.compile(r"vpnw \d\d:\d\d:\d\d\.\d{3}  ")
    starts = [m.start() for m in human.finditer(r.stderr)]
    assert len(starts) > 60
    for start in starts:
        line = r.stderr[start:r.stderr.index("\n", start)]
        assert "x" * 10 not in line and ":END" not in line, line


# ── the record on stdout never mixes with the program's output ──────────

def test_record_on_stdout_through_a_pipe_parses_line_by_line(world, user):
    program = ("import urllib.request\n"
               "for i in range(50):\n"
               "    print('program line', i, '{not json')\n"
               "urllib.request.urlopen('http://api.github.com/whoami', timeout=30).read()\n")
    path = world.file(f"record-stdout-{user}.py", program)
    vpnw = str(world.vpnw_path)
    r = world.run(["sh", "-c", f"{vpnw} run --record - -- {SYSTEM_PYTHON} {path} | jq -c .type"],
                  user=user, timeout=120)
    assert r.returncode == 0, describe(r)
    types = [json.loads(line) for line in r.stdout.splitlines()]
    assert types[0] == "run.start" and types[-1] == "run.end", types
    assert "conn.open" in types
    # The program's stdout went to stderr, whole.
    assert r.stderr.count("program line") == 50, r.stderr


def test_record_on_stdout_in_a_terminal(world, term):
    """On a terminal, `--record - ... | jq` still gives the program a pty
    (on stderr's terminal) and jq every line of the record."""
    out = term.work / "types.txt"
    status = term.run(f"{term.vpnw} run --record - -- {SYSTEM_PYTHON} -c "
                      f"\"import os; print('tty', os.isatty(1))\" | jq -c .type > {out}")
    assert status == 0
    term.wait_for(r"^tty True", whole=True)
    types = [json.loads(line) for line in wait_file(out).splitlines()]
    assert types[0] == "run.start" and types[-1] == "run.end", types


def test_a_log_that_cannot_be_written_is_refused_before_anything_runs(world, user):
    marker = world.workdir(user) / "ran"
    r = world.vpnw(["run", "--log", "/nonexistent-dir/vpnw.log", "--", "touch", str(marker)],
                   user=user)
    assert r.returncode == 121, describe(r)
    assert "--log /nonexistent-dir/vpnw.log: cannot open it for writing" in r.stderr
    assert not marker.exists()
    assert r.run_files() == []


def test_quiet_and_log(world, term):
    log = term.work / "vpnw.log"
    assert term.run(f"{term.vpnw} trace --quiet -- {SYSTEM_PYTHON} -c "
                    "\"import urllib.request; urllib.request.urlopen('http://api.github.com/whoami')\"") == 0
    shown = term.history()
    assert re.search(r"^vpnw  run r-\S+: 1 connections", shown, re.M), shown
    assert " open " not in shown and "→" not in shown
    assert term.run(f"{term.vpnw} trace --log {log} -- {SYSTEM_PYTHON} -c "
                    "\"import urllib.request; urllib.request.urlopen('http://api.github.com/whoami')\"") == 0
    text = wait_file(log, lambda t: "1 connections" in t)
    assert re.search(r"#1\s+open ", text), text
    assert text.count("run r-") >= 2  # the run.start line and the summary
    assert term.history().count("1 connections") == 1  # only the --quiet run's, on the screen


# ── trace: a line editor's prompt and half-typed input drawn again (issue 28) ──

INNER_PROMPT = "in> "


def _cursor_x(term) -> int:
    return int(term._tmux("display-message", "-p", "-t", "t", "#{cursor_x}").strip())


def _half_typed_behind_a_job(term, before: str, job: str) -> None:
    """An inner bash (`before` it: vpnw's command, or nothing for the control)
    at its prompt with a background `job` waiting for ./go, and "echo half"
    typed with the cursor two to the left."""
    term.line(f"{before}env PS1='{INNER_PROMPT}' bash --norc --noprofile -i")
    term.wait_for(rf"^{INNER_PROMPT}$")
    term.line(job)
    term.wait_for(r"^\[1\] \d+$")
    term.wait_for(rf"^{INNER_PROMPT}$")
    term.type("echo half")
    term.keys("Left", "Left")
    term.wait_for(rf"^{INNER_PROMPT}echo half$")


def test_trace_draws_a_readline_prompt_and_the_half_typed_input_again(world, term):
    """bash (readline: bracketed paste on, the input edited in place) waits at
    its prompt with half a line typed; a background job connects, and trace's
    lines for it go out on lines of their own after the hold. Below them the
    prompt and the half-typed input are drawn again, the cursor where it was,
    and readline goes on editing that line."""
    job = (f"(while [ ! -e go ]; do sleep 0.05; done; "
           f"curl -sS -o /dev/null --max-time 20 http://api.github.com/whoami) &")
    _half_typed_behind_a_job(term, f"{term.vpnw} trace -- ", job)
    assert _cursor_x(term) == len(f"{INNER_PROMPT}echo ha")
    (term.work / "go").touch()
    # trace's lines for the connection, then the prompt and the input again, last.
    term.wait_for(rf"^vpnw \S+\s+#1\s+open .*\n(?:.*\n)*{INNER_PROMPT}echo half\s*\Z")
    assert _cursor_x(term) == len(f"{INNER_PROMPT}echo ha"), term.screen()
    term.type("X")
    term.keys("Enter")
    term.wait_for(r"^haXlf$")
    term.line("exit")
    term.wait_for(r"^vpnw \S+\s+run r-\S+: .*exit 0", whole=True)


def test_control_outside_vpnw_a_line_written_at_the_prompt_leaves_it_as_it_was(world, term):
    """The control: the same prompt outside vpnw, and a background job that
    writes a line there: bash draws nothing again (the line ends up after the
    half-typed input, and no prompt below it), which is what the test above
    would see if vpnw did not draw it."""
    job = "(while [ ! -e go ]; do sleep 0.05; done; echo from-the-job) &"
    _half_typed_behind_a_job(term, "", job)
    (term.work / "go").touch()
    term.wait_for(r"from-the-job")
    time.sleep(1)   # what vpnw's hold would have waited, and more: nothing is drawn again
    assert not re.search(rf"from-the-job\s*\n{INNER_PROMPT}echo half\s*\Z", term.screen()), term.screen()
    term.keys("C-c")
    term.line("exit")

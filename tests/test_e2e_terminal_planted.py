"""Issue 32 on a real terminal (tmux), as root and as vpnwtest.

Finding 3: with only some of fds 0-2 on the terminal
(`vpnw run -- agent < /dev/null &`, `vpnw run -- prog > out.log`) the program
still gets a pty of its own, never an fd of the user's terminal (sudo's
use_pty). A program that tries everything on every terminal it holds (modes,
TIOCEXCL, a new window size, reading keys) changes nothing of the user's
terminal and reads nothing the user types at the shell. The control runs the
same program outside vpnw, holding the terminal outside job control
(`setsid`), as the sandboxed program did before: there it changes the user's
terminal. The terminal is read from the test itself (the pane's tty), never
through the shell, whose line editor sets modes of its own.

Finding 10: vpnw's DENY line never goes into an alternate screen the program
entered with a mode list (`ESC[?1;1049h`), where it would be lost; OSC 52
(the clipboard) passes as with ssh and sudo, and `--no-clipboard` drops it.
"""
from __future__ import annotations

import array
import re
import base64
import fcntl
import os
import struct
import termios
import time

import pytest

from progs_support import prog_text
from test_e2e_terminal import SYSTEM_PYTHON, write
from tmux_support import wait_file

pytestmark = pytest.mark.world

# Everything a program can do to a terminal it holds, on each of fds 0-2 and
# /dev/tty that is one; then it reads every such terminal until STOP exists.
PLANTED = prog_text("planted.py")

TIOCGEXCL = 0x80045440


def pane_terminal(term) -> dict:
    """The user's terminal as the kernel has it: mode, exclusive flag, size."""
    path = term._tmux("display-message", "-p", "-t", "t", "#{pane_tty}").strip()
    fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        excl = array.array("i", [0])
        fcntl.ioctl(fd, TIOCGEXCL, excl)
        size = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))[:2]
        return {"mode": termios.tcgetattr(fd), "exclusive": excl[0], "size": size}
    finally:
        os.close(fd)


def _stop(term, out) -> str:
    (out / "STOP").touch()
    # "done" is made, then written: wait for what the program read (a repr).
    return wait_file(out / "done", lambda text: text.endswith(("'", '"')))


def _arm_planted(world, term, where: str, outside: str, start) -> tuple:
    """Start PLANTED with `start(command, out)`, under vpnw or, as the control,
    outside behind `outside` (a setsid line), and wait until it has touched
    every terminal it holds. Returns its folder, the user's terminal before
    and during, and what `start` gave. The control has changed the terminal:
    a process holding it outside job control changes it for the shell and
    everything after."""
    program = write(world, term, "planted.py", PLANTED)
    out = term.work / f"out-{where}"
    out.mkdir()
    os.chown(out, term.work.stat().st_uid, term.work.stat().st_gid)
    before = pane_terminal(term)
    prefix = f"{term.vpnw} run -- " if where == "vpnw" else outside
    started = start(f"{prefix}{SYSTEM_PYTHON} {program} {out}", out)
    wait_file(out / "armed")
    during = pane_terminal(term)
    if where == "outside":
        assert during["exclusive"] == 1 and during["size"] == (11, 33), during
        assert during["mode"][5] == termios.B300, during
        _stop(term, out)
    return out, before, during, started


@pytest.mark.parametrize("where", ["vpnw", "outside"])
def test_a_background_program_without_stdin_leaves_the_terminal_to_the_shell(world, term, where):
    out, before, during, _ = _arm_planted(
        world, term, where, "setsid ", lambda command, out: term.line(f"{command} < /dev/null &"))
    if where == "outside":
        return
    assert during == before
    term.line("echo typed-$((40+2))")
    term.wait_for(r"^typed-42$", whole=True)      # the shell read what the user typed
    assert _stop(term, out) == "b''"              # and the program read nothing of it
    term.wait_for(r"^vpnw  run r-\S+: .*exit 0", whole=True)
    term.wait_for(r"read b''$", whole=True)       # the program's output reached the screen
    assert pane_terminal(term) == before


@pytest.mark.parametrize("where", ["vpnw", "outside"])
def test_stdout_to_a_file_keeps_the_keys_in_the_programs_own_terminal(world, term, where):
    out, before, during, mark = _arm_planted(
        world, term, where, "setsid -w ", lambda command, out: term.start(f"{command} > {out}/out.log"))
    if where == "outside":
        return
    # vpnw holds the terminal raw for the relay; nothing of the program's reached it.
    assert (during["exclusive"], during["size"], during["mode"][4:6]) == \
        (0, before["size"], before["mode"][4:6]), during
    term.type("hello")
    term.keys("Enter")
    # The keys reach the program through its pty; its stdout is the file.
    wait_file(out / "read", lambda text: "hello" in text)
    assert _stop(term, out) == repr(b"hello\n")
    assert term.finished(mark) == 0
    text = (out / "out.log").read_text()
    assert "touched 2\n" in text and "read b'hello\\n'\n" in text, text
    assert pane_terminal(term) == before


# ── finding 10: the alternate screen, the clipboard ─────────────────────

ALT_SCREEN_DENY = prog_text("alt_screen_deny.py")

DENY_ALL = 'version = 1\nname = "t"\n[policy]\ndefault = "deny"\nallow = ["nothing.test"]\n'


@pytest.mark.parametrize("where", ["vpnw", "outside"])
def test_a_deny_line_is_never_lost_in_an_alternate_screen_entered_by_a_mode_list(
        world, term, where):
    program = write(world, term, "alt_screen_deny.py", ALT_SCREEN_DENY)
    policy = write(world, term, "deny.toml", DENY_ALL)
    go = term.work / f"go-{where}"
    prefix = f"{term.vpnw} guard --policy {policy} -- " if where == "vpnw" else ""
    mark = term.start(f"{prefix}{SYSTEM_PYTHON} {program} {go}")
    term.wait_for(r"^on the alternate screen$")
    if where == "vpnw":
        runs = term.state_home / "vpnw" / "runs"
        wait_file_matching(runs, "policy.deny")
        # Held while the program is on the alternate screen: not painted there.
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            assert "DENY" not in term.screen(), term.screen()
            time.sleep(0.05)
    go.touch()
    term.wait_for(r"back on the normal screen", whole=True)
    term.finished(mark)
    shown = term.history()
    # The control: what was painted on the alternate screen is gone with it.
    assert "on the alternate screen" not in shown, shown
    if where == "vpnw":
        assert re.search(r"^vpnw \S+\s+#1\s+DENY\s+api\.github\.com:80", shown, re.M), shown


def wait_file_matching(directory, text: str) -> None:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if any(text in f.read_text() for f in directory.glob("*.jsonl")):
            return
        time.sleep(0.05)
    raise AssertionError(f"no run file in {directory} holds {text!r}")


OSC52 = r'''
import sys
sys.stdout.write("\x1b]52;c;%s\x07clipboard sent\n" % sys.argv[1])
'''


@pytest.mark.parametrize("flag", ["--no-clipboard", None])
def test_no_clipboard_drops_osc_52(world, term, flag):
    """With tmux's set-clipboard on, an OSC 52 from the pane becomes a paste
    buffer. The control (no flag) shows it passes, as documented; the flag
    drops it, and the program's other output still arrives."""
    term._tmux("set-option", "-s", "set-clipboard", "on")
    secret = f"planted-{flag is None}-{time.monotonic_ns()}"
    program = write(world, term, "osc52.py", OSC52)
    encoded = base64.b64encode(secret.encode()).decode()
    assert term.run(f"{term.vpnw} run {flag or ''} -- {SYSTEM_PYTHON} {program} {encoded}") == 0
    term.wait_for(r"^clipboard sent$", whole=True)
    buffers = term._tmux("list-buffers", "-F", "#{buffer_sample}")
    assert (secret in buffers) == (flag is None), buffers

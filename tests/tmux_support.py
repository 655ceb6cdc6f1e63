"""A real terminal for the tests: a tmux server of the test's own (its own
socket), a shell in the test world as root or as the unprivileged user, keys
typed with `send-keys` and the screen read with `capture-pane`.

Nothing here sleeps a fixed time: every wait polls the screen (or a file)
until what the test expects is there, with a deadline, and a timeout fails
with the screen as it was.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ci_support import cannot

TMUX = shutil.which("tmux")
DEADLINE = 60.0          # generous: the machine is shared and loaded
PROMPT = "$ "


def need_tmux() -> None:
    if TMUX is None:
        cannot("tmux is missing (scripts/setup installs it)")


class Screen:
    """One tmux session running `argv` (a shell, usually) in a pane of width x height."""

    def __init__(self, tmpdir: Path, argv: list[str], *, width: int = 100, height: int = 30):
        need_tmux()
        self.sock = str(tmpdir / "tmux.sock")
        self.width, self.height = width, height
        self._tmux("-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(width),
                   "-y", str(height), *argv)
        self._tmux("set-option", "-g", "status", "off")
        self._tmux("set-option", "-g", "history-limit", "100000")
        self._tmux("set-option", "-g", "remain-on-exit", "on")

    def _tmux(self, *args: str) -> str:
        proc = subprocess.run([TMUX, "-S", self.sock, *args], capture_output=True, text=True,
                              timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    # ---- typing

    def type(self, text: str) -> None:
        """Literal text (no key names)."""
        self._tmux("send-keys", "-t", "t", "-l", text)

    def keys(self, *names: str) -> None:
        """Key names: Enter, Escape, C-z, Left, Space..."""
        self._tmux("send-keys", "-t", "t", *names)

    def line(self, text: str) -> None:
        self.type(text)
        self.keys("Enter")

    # ---- reading

    def screen(self) -> str:
        """What the pane shows now, wrapped lines joined."""
        return self._tmux("capture-pane", "-p", "-J", "-t", "t")

    def history(self) -> str:
        """Everything the pane has shown, wrapped lines joined."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-", "-E", "-", "-t", "t")

    def wait_for(self, pattern: str, *, whole: bool = False, timeout: float = DEADLINE) -> re.Match:
        """Poll until `pattern` (a regex) is on the screen (or, with whole, in the history)."""
        regex = re.compile(pattern, re.M)
        end = time.monotonic() + timeout
        delay = 0.02
        while True:
            text = self.history() if whole else self.screen()
            found = regex.search(text)
            if found:
                return found
            if time.monotonic() > end:
                raise AssertionError(f"{pattern!r} never appeared within {timeout:.0f} s; "
                                     f"the pane shows:\n{self.history()[-6000:]}")
            time.sleep(delay)
            delay = min(delay * 2, 0.25)

    def wait_gone(self, pattern: str, *, timeout: float = DEADLINE) -> None:
        regex = re.compile(pattern, re.M)
        end = time.monotonic() + timeout
        while regex.search(self.screen()):
            if time.monotonic() > end:
                raise AssertionError(f"{pattern!r} still on the screen after {timeout:.0f} s:\n"
                                     f"{self.screen()}")
            time.sleep(0.05)

    def start(self, command: str) -> int:
        """Type a shell command followed by a marker that shows its exit status;
        returns the marker's number for `finished`."""
        self.marks = getattr(self, "marks", 0) + 1
        typed = f"{command}; echo \"@@{self.marks}@@$((6*7))@@$?@@\""
        if (len(PROMPT) + len(typed)) % self.width == 0:
            # A line that ends on the last column is joined by capture-pane -J
            # to the next one (the program's first line): one space more.
            typed += " "
        self.line(typed)
        return self.marks

    def finished(self, mark: int, *, timeout: float = DEADLINE) -> int:
        """Wait for the command of `mark` to end; its exit status. The marker's
        text on the screen differs from what was typed, so the typed line
        never satisfies the wait."""
        return int(self.wait_for(rf"^@@{mark}@@42@@(\d+)@@", whole=True, timeout=timeout).group(1))

    def run(self, command: str, *, timeout: float = DEADLINE) -> int:
        """Type a shell command and wait for it to end; returns its exit status."""
        return self.finished(self.start(command), timeout=timeout)

    def resize(self, width: int, height: int) -> None:
        self._tmux("resize-window", "-t", "t", "-x", str(width), "-y", str(height))

    def close(self) -> None:
        subprocess.run([TMUX, "-S", self.sock, "kill-server"], capture_output=True, timeout=30)


def wait_file(path: Path, predicate=lambda text: True, *, timeout: float = DEADLINE) -> str:
    end = time.monotonic() + timeout
    while True:
        try:
            text = path.read_text()
            if predicate(text):
                return text
        except OSError:
            pass
        if time.monotonic() > end:
            raise AssertionError(f"{path} never reached the expected content")
        time.sleep(0.05)


def world_shell(world, user: str, tmpdir: Path) -> Screen:
    """A pane with an interactive bash in the test world, as `user`, in that
    user's work directory (`screen.work`); `screen.vpnw` is the vpnw to type."""
    tmpdir.chmod(0o755)
    work = world.workdir(user)
    argv, state_home = world.command(["bash", "--norc", "--noprofile", "-i"], user=user,
                                     env={"TERM": "screen", "PS1": PROMPT}, cwd=work)
    screen = Screen(tmpdir, argv)
    screen.work = work
    screen.state_home = state_home
    screen.vpnw = str(world.vpnw_path)
    screen.wait_for(r"^\$ ")
    return screen

"""Shell completion as README documents it (click's _VPNW_COMPLETE), typed into
a real bash in a real terminal (tmux): Tab completes subcommands and options."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ci_support import cannot

VPNW = Path(sys.executable).parent / "vpnw"


class Pane:
    def __init__(self, tmp: Path, rcfile: Path):
        self.tmux = ["tmux", "-S", str(tmp / "tmux.sock"), "-f", "/dev/null"]
        env = {"PATH": f"{VPNW.parent}:/usr/bin:/bin", "HOME": str(tmp), "TERM": "xterm", "LANG": "C.UTF-8"}
        subprocess.run([*self.tmux, "new-session", "-d", "-x", "150", "-y", "30",
                        "bash", "--noprofile", "--rcfile", str(rcfile), "-i"], check=True, env=env)

    def screen(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p"], capture_output=True, text=True).stdout

    def wait_for(self, text: str) -> str:
        # Waits for what the terminal shows, up to a generous bound; never a timing assertion.
        for _ in range(1500):
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.02)
        raise AssertionError(f"the terminal never showed {text!r}:\n{self.screen()}")

    def wait_for_last_line(self, text: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            lines = [line for line in self.screen().splitlines() if line.strip()]
            if lines and lines[-1].rstrip() == text:
                return
            time.sleep(0.1)
        raise AssertionError(f"the last line never became {text!r}:\n{self.screen()}")

    def type(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "--", *keys], check=True)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


def test_bash_completes_vpnw_commands_and_options(tmp_path):
    if shutil.which("tmux") is None or shutil.which("bash") is None:
        if os.environ.get("CI"):
            pytest.fail("tmux and bash are needed (scripts/setup installs tmux)")
        cannot("tmux and bash are needed (scripts/setup installs tmux)")
    rcfile = tmp_path / "bashrc"
    # The line README tells a user to put in ~/.bashrc.
    rcfile.write_text("PS1='ready$ '\n" 'eval "$(_VPNW_COMPLETE=bash_source vpnw)"\n')
    pane = Pane(tmp_path, rcfile)
    try:
        pane.wait_for("ready$")   # capture-pane drops trailing blanks
        pane.type("vpnw gu", "Tab")
        pane.wait_for("ready$ vpnw guard")
        pane.type("--po", "Tab")      # bash put a space after "guard"
        pane.wait_for("ready$ vpnw guard --policy")
        pane.type("C-c")
        # Type on only once the fresh prompt is the last line: keys sent while
        # bash still runs the completion would join the old line.
        pane.wait_for_last_line("ready$")
        pane.type("vpnw do", "Tab")
        pane.wait_for("ready$ vpnw doctor")
    finally:
        pane.close()


def test_bash_completes_presets_and_run_ids(tmp_path):
    """Tab after `--policy @`, `vpnw presets ` and `vpnw show ` (issue 45):
    the presets' names, and the run ids (a prefix, with or without "r-")."""
    if shutil.which("tmux") is None or shutil.which("bash") is None:
        if os.environ.get("CI"):
            pytest.fail("tmux and bash are needed (scripts/setup installs tmux)")
        cannot("tmux and bash are needed (scripts/setup installs tmux)")
    runs = tmp_path / ".local" / "state" / "vpnw" / "runs"
    runs.mkdir(parents=True)
    for run_id in ("r-5e1f00aa11bb", "r-9c0d22cc33dd", "r-9c7e44ee55ff"):
        (runs / f"{run_id}.jsonl").write_text("{}\n")
    rcfile = tmp_path / "bashrc"
    rcfile.write_text("PS1='ready$ '\n" 'eval "$(_VPNW_COMPLETE=bash_source vpnw)"\n')
    pane = Pane(tmp_path, rcfile)

    def completes(typed: str, shown: str) -> None:
        pane.wait_for_last_line("ready$")
        pane.type(typed, "Tab")
        pane.wait_for(f"ready$ {shown}")
        pane.type("C-c")
    try:
        pane.wait_for("ready$")
        completes("vpnw guard --policy @cl", "vpnw guard --policy @claude-code")
        completes("vpnw run --policy @li", "vpnw run --policy @litellm")
        completes("vpnw presets cl", "vpnw presets claude-code")
        completes("vpnw show 5e", "vpnw show r-5e1f00aa11bb")
        completes("vpnw show r-9c7", "vpnw show r-9c7e44ee55ff")
        completes("vpnw learn --from 5", "vpnw learn --from r-5e1f00aa11bb")
    finally:
        pane.close()

"""For the tests of the start-up (stages/startup/): the mark of those that
check a trick is in place (with the tricks off, VPNW_STARTUP_TRICKS=off,
there is nothing for them to check, and they skip, saying so), and what a
vpnw starting has loaded at its forks."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import pytest

from progs_support import prog_text
from stages import startup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_the_tricks = pytest.mark.skipif(
    not startup.ON, reason="VPNW_STARTUP_TRICKS=off: checks a start-up trick that is off")


def until_the_forks(at_fork: str) -> str:
    """tests/progs/until_the_forks.py's source with `at_fork(forks)` (the
    body `at_fork` given, run at each fork in vpnw) defined before it."""
    return "def at_fork(forks):\n" + textwrap.indent(at_fork, "    ") + "\n" + prog_text("until_the_forks.py")


# The module names vpnw has loaded at each fork, one line each.
AT_THE_FORKS = prog_text("until_the_forks.py")


def modules_loaded(code: str, tricks: str, cwd) -> list[set[str]]:
    """Each listing `code` printed (a line that starts with "["), run in a
    fresh interpreter with this checkout first on its path and
    VPNW_STARTUP_TRICKS=`tricks`."""
    env = {**os.environ, "PYTHONPATH": ROOT, startup.VARIABLE: tricks,
           "XDG_STATE_HOME": str(cwd / "state")}
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n" + code],
                         check=True, cwd=cwd, env=env, capture_output=True, text=True,
                         stdin=subprocess.DEVNULL).stdout
    return [set(ast.literal_eval(line)) for line in out.splitlines() if line.startswith("[")]

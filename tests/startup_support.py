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

from stages import startup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_the_tricks = pytest.mark.skipif(
    not startup.ON, reason="VPNW_STARTUP_TRICKS=off: checks a start-up trick that is off")


def until_the_forks(at_fork: str, last: int = 2) -> str:
    """Python source that starts `vpnw run --record - -- true` as the console
    script does, with os.fork replaced: at each fork `at_fork` runs in vpnw
    (`forks` counts them), the forked child ends at once, and the `last`th
    fork (the recorder's is the second) ends it all."""
    return f"""
import os, sys
real_fork, forks = os.fork, []
def fork():
    forks.append(1)
{textwrap.indent(at_fork, "    ")}
    if len(forks) == {last}:
        os._exit(0)
    pid = real_fork()
    if pid == 0:
        os._exit(0)
    return pid
os.fork = fork
from stages.orchestrator import main
main.main(["run", "--record", "-", "--", "true"])
"""


# The module names vpnw has loaded at each fork, one line each (no json:
# the listing must not load what it lists).
AT_THE_FORKS = until_the_forks("print(repr(sorted(sys.modules)), flush=True)")


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

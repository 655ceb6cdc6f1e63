"""vpnw's exit codes (docs/architecture.md, "Exit codes"): the one place they are defined.

The orchestrator is the only process that decides vpnw's own exit code; the
stages use these to say how they ended, and the command layer uses them for
bad input. Anything else vpnw exits with is the program's own status.
"""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    DENIED = 120          # guard: at least one connection was denied
    USAGE = 121           # bad command line, config or policy; nothing was started
    NO_SANDBOX = 122      # the sandbox cannot be built; the program was not run
    PATH_DOWN = 123       # the chosen path is down (checked before the program starts)
    STILL_RUNNING = 124   # show --verify: the run is still going; what is there so far holds
    INTERNAL = 125        # vpnw itself failed during the run
    CANNOT_EXECUTE = 126  # the program cannot be executed
    NOT_FOUND = 127       # the program was not found


def killed_by(signum: int) -> int:
    """The exit code of a program killed by signal `signum`, as a shell reports it."""
    return 128 + int(signum)

"""The helper stage: the sandbox the program runs in (docs/architecture.md, "The sandbox").

Kept light: the orchestrator imports this module; everything heavy is
imported inside the forked helper process.
"""
from __future__ import annotations

import os
import socket  # noqa: F401  (the helper's first import of it, here as before)
TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing (~4 ms)

from stages.startup import collector  # noqa: E402
from stages.wire.pty_handoff import ProgramTerminal  # noqa: E402

if TYPE_CHECKING:   # annotations only: the helper imports no policy code at run time
    from typing import NoReturn

    from stages.config.file_limits import MountPlan
    from stages.config.protected import HelperProtection


def run_helper(argv: list[str], *, handoff_fd: int, status_fd: int, go_fd: int,
               allow_unix_sockets: bool = False, env: dict[str, str] | None = None,
               files: MountPlan | None = None, tty: ProgramTerminal | None = None,
               protected: HelperProtection | None = None, capture: bool = False, local_ports: tuple = (),
               unix_allow: list[tuple[str, str]] = ()) -> NoReturn:
    """Seal, report on status_fd, wait for go, run argv, report its end; never returns.

    Call it in a freshly forked, single-threaded child. Status lines are
    stages/wire/status.py's HELPER_STATUS messages. With `tty`
    (stages/wire/pty_handoff.py) the program gets a pty of its own, made
    in the sandbox: its master goes to the orchestrator over that socket, its
    slave becomes the controlling terminal of the program's session, and the
    program's stops are reported. `protected`: stages/config/protected.py's
    Protection.to_helper() (read-only and hidden paths).
    """
    def body():
        # The seal and all it brings: in the forked helper alone (the
        # orchestrator imports this module), as every import below.
        from stages.helper.seal import run
        return run(argv, handoff_fd, status_fd, go_fd, allow_unix_sockets, env, files, tty=tty,
                   protected=protected, capture=capture, local_ports=local_ports,
                   unix_allow=unix_allow)
    _exit_with(body, status_fd)


def run_helper_first(argv: list[str], *, handoff_fd: int, status_fd: int, go_fd: int,
                     plan_fd: int, allow_unix_sockets: bool = False,
                     tty: ProgramTerminal | None = None) -> NoReturn:
    """run_helper, forked before vpnw has loaded the policy: what needs no
    policy first, then the plan from `plan_fd` (stages/wire/helper_plan.py),
    then the rest. No plan (the pipe ended first: vpnw refused the run or
    died): exits having made nothing."""
    def next_plan():
        from stages.wire import helper_plan  # in the forked helper alone
        plan = helper_plan.receive(plan_fd)
        os.close(plan_fd)
        return plan

    def body():
        from stages.helper.seal import run_planned  # in the forked helper alone
        return run_planned(argv, handoff_fd, status_fd, go_fd, allow_unix_sockets, tty, next_plan)
    _exit_with(body, status_fd)


def _exit_with(body, status_fd: int) -> NoReturn:
    """body()'s code as the process's exit; never returns into the orchestrator's code.
    No garbage collection until Ready (processes.collect_from_now)."""
    collector.pause()
    from stages.wire.exits import ExitCode  # in the forked helper alone
    code = ExitCode.INTERNAL
    try:
        code = body()
    except BaseException as e:  # never return into the orchestrator's code
        try:
            from stages.wire import status  # in the forked helper alone
            status.write(status_fd, status.SandboxFailed(f"the sandbox helper failed: {e!r}",
                                                         ExitCode.INTERNAL))
        except BaseException:
            pass
    finally:
        os._exit(code & 0xFF if code >= 0 else ExitCode.INTERNAL)

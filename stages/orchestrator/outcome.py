"""vpnw's exit code from what the stages reported: pure, no forks, no I/O.

The run's wait (watch.py, stage_reports.py) collects the stages' status
messages into `Reports`; this decides, in one order, which of them speaks
for the run (docs/architecture.md,
"Exit codes"): an interruption before the program started, a refused status
message, the path down, the seal, vpnw's own failure, the program that could
not be executed, a missing exit report, a denial under guard, then the
program's own code.
"""
from __future__ import annotations

import signal

from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.wire import status as st
from stages.wire.exits import ExitCode, killed_by


class Reports(NamedTuple):
    """What the stages reported."""
    path_name: str = "direct"
    started: bool = False
    path_ok: bool | None = None             # None: the broker never said
    path_down: object = None                # st.PathDown, or a message when the broker said nothing
    seal_error: str | None = None
    fatal: str | None = None
    refused: str | None = None              # a stage's status message refused (first of all)
    interrupted: int | None = None          # a signal that came before the program started
    exec_error: st.ExecFailed | None = None
    program_exit: st.Exited | None = None
    totals: st.Totals | None = None


def exit_code(r: Reports) -> tuple[int, str | None]:
    """(vpnw's exit code, the message to say, or None when the program's code speaks)."""
    if r.interrupted and not r.started:
        # Like a shell: 128 + the signal. The program was never run.
        return killed_by(r.interrupted), (f"interrupted by {signal.Signals(r.interrupted).name} "
                                          f"before the program started; the program was not run")
    if r.refused:
        return ExitCode.INTERNAL, r.refused
    if r.path_ok is False and not r.started:
        down = r.path_down
        why = down.error if isinstance(down, st.PathDown) else (down or "no answer")
        return ExitCode.PATH_DOWN, (f"the path {r.path_name!r} is down: {why}; the program was "
                                    f"not started (vpnw never falls back to a direct connection)")
    if r.seal_error:
        return ExitCode.NO_SANDBOX, r.seal_error
    if r.fatal:
        return ExitCode.INTERNAL, r.fatal
    if r.exec_error:
        return r.exec_error.code, r.exec_error.error
    if r.program_exit is None:
        return ExitCode.INTERNAL, "the sandbox ended without reporting the program's exit"
    totals = r.totals or st.Totals()
    if totals.denied or totals.would_deny:
        return ExitCode.DENIED, None
    if r.program_exit.signal:
        return killed_by(r.program_exit.signal), None
    return r.program_exit.code, None

"""The run's phases and what each stage's status message means in each: one
table keyed by (phase, message kind), the discipline of OpenSSH's monitor
dispatch tables. A message whose (phase, kind) is not in the table is
refused: the stage is stopped and the run ends 125 (outcome.py, "refused").

Each channel has a phase of its own. The helper: sealing -> sealed (its
Ready) -> running (vpnw sent go: not a message, stage_reports.go_sent) ->
over (its last message). The broker: checking -> checked (its path report)
-> over (Totals). Nothing is accepted from a stage that is over. What exit
code the reports come to is outcome.py's, in one order; the table says
which phase follows and which event the message puts in the record."""
from __future__ import annotations

from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.wire import status as st

SEALING, SEALED, RUNNING = "sealing", "sealed", "running"     # the helper's
CHECKING, CHECKED = "checking", "checked"                     # the broker's
OVER = "over"                                                 # both: the stage said its last

FIRST_PHASE = {"helper": SEALING, "broker": CHECKING}

PHASE_WORDS = {SEALING: "the sandbox was being sealed", SEALED: "the program waited to start",
               RUNNING: "the program ran", OVER: "the stage had sent its last message",
               CHECKING: "the path was being checked", CHECKED: "the path had been reported"}


class Step(NamedTuple):
    """What a message accepted in a phase leads to."""
    follows: str                 # the channel's phase after it
    records: tuple = ()          # the event kinds it may put in the record


def _steps(phases, kind, follows, records=()) -> dict:
    return {(phase, kind): Step(follows, records) for phase in phases}


STEPS = {
    # The helper's channel.
    **_steps((SEALING,), st.Ready, SEALED, ("sandbox.ready",)),
    **_steps((RUNNING,), st.Stopped, RUNNING),                  # only on a terminal
    **_steps((RUNNING,), st.UnixConnect, RUNNING, ("unix.allow", "unix.deny")),  # the supervisor's
    **_steps((RUNNING,), st.LoopbackRefused, RUNNING),          # the supervisor's too
    **_steps((SEALING, SEALED, RUNNING), st.SandboxFailed, OVER),
    **_steps((SEALING, SEALED, RUNNING), st.ExecFailed, OVER),
    **_steps((RUNNING,), st.Exited, OVER, ("program.exit",)),
    # The broker's channel.
    **_steps((CHECKING,), st.PathOk, CHECKED),
    **_steps((CHECKING,), st.PathDown, CHECKED),
    **_steps((CHECKING, CHECKED), st.Totals, OVER),             # a broker that fails first sends only Totals
}


def step(phase: str, message) -> Step:
    """The step a message takes in a phase; StatusError when it may not come now."""
    found = STEPS.get((phase, type(message)))
    if found is None:
        raise st.StatusError(f"{type(message).__name__} while {PHASE_WORDS[phase]}")
    return found

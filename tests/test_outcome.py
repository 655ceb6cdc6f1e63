"""The exit code from what the stages reported (stages/orchestrator/outcome.py):
each report, and which one wins when several came."""
from __future__ import annotations

import signal

import pytest

from stages.orchestrator.outcome import Reports, exit_code
from stages.wire import status as st
from stages.wire.exits import ExitCode

RAN = dict(started=True, path_ok=True, program_exit=st.Exited(0, None), totals=st.Totals())


@pytest.mark.parametrize("reports, code, says", [
    (Reports(**RAN), 0, None),
    (Reports(**{**RAN, "program_exit": st.Exited(3, None)}), 3, None),
    (Reports(**{**RAN, "program_exit": st.Exited(-1, signal.SIGKILL)}), 128 + 9, None),
    (Reports(**{**RAN, "totals": st.Totals(denied=1)}), ExitCode.DENIED, None),
    (Reports(**{**RAN, "totals": st.Totals(would_deny=2)}), ExitCode.DENIED, None),
    (Reports(**{**RAN, "program_exit": None}), ExitCode.INTERNAL, "without reporting"),
    (Reports(interrupted=signal.SIGINT), 130, "interrupted by SIGINT"),
    (Reports(path_name="office", path_ok=False, path_down="no answer from 10.0.0.1"),
     ExitCode.PATH_DOWN, "the path 'office' is down: no answer from 10.0.0.1"),
    (Reports(seal_error="no user namespaces"), ExitCode.NO_SANDBOX, "no user namespaces"),
    (Reports(started=True, fatal="the broker stopped"), ExitCode.INTERNAL, "the broker stopped"),
    (Reports(started=True, exec_error=st.ExecFailed("not found", ExitCode.NOT_FOUND)),
     ExitCode.NOT_FOUND, "not found"),
])
def test_each_report_gives_its_code(reports, code, says):
    got, message = exit_code(reports)
    assert got == code
    assert (message is None) if says is None else (says in message)


def test_the_order_when_several_reports_came():
    # A refused status message outranks everything but an early interruption;
    # the path outranks the seal; denials outrank the program's own code.
    every = Reports(path_ok=False, path_down="down", seal_error="seal", fatal="fatal",
                    refused="refused")
    assert exit_code(every) == (ExitCode.INTERNAL, "refused")
    assert exit_code(Reports(path_ok=False, path_down="x", seal_error="seal"))[0] == ExitCode.PATH_DOWN
    assert exit_code(Reports(interrupted=signal.SIGTERM, refused="r"))[0] == 128 + signal.SIGTERM
    # Once the program ran, an interruption is the program's business.
    assert exit_code(Reports(**{**RAN, "interrupted": signal.SIGINT}))[0] == 0
    assert exit_code(Reports(**{**RAN, "program_exit": st.Exited(-1, signal.SIGTERM),
                                "totals": st.Totals(denied=1)}))[0] == ExitCode.DENIED


def test_every_status_message_has_its_phases_in_the_table():
    from stages.orchestrator.phases import OVER, PHASE_WORDS, STEPS, step
    helper_phases = {"sealing", "sealed", "running"}
    kinds = lambda phases: {kind for (phase, kind) in STEPS if phase in phases}   # noqa: E731
    assert kinds(helper_phases) == set(st.HELPER_STATUS)
    assert kinds({"checking", "checked"}) == set(st.BROKER_STATUS)
    phases = {phase for phase, _ in STEPS} | {s.follows for s in STEPS.values()}
    assert phases <= set(PHASE_WORDS)
    # Nothing is accepted from a stage after its last message.
    assert all(phase != OVER for phase, _ in STEPS)
    # A channel's phases take only its own messages (the key is the pair).
    assert not kinds(helper_phases) & kinds({"checking", "checked"})
    with pytest.raises(st.StatusError, match="Exited while the program waited to start"):
        step("sealed", st.Exited(0, None))
    assert step("running", st.Exited(0, None)).follows == OVER

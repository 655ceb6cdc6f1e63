"""The orchestrator: starts the stages, wires their pipes, waits, decides the exit code.

It is the only process that decides vpnw's exit code (docs/architecture.md, "Exit codes"). Each stage
is forked from this single-threaded process and runs its own `main_from_fds`;
the stages import their heavy modules only after the fork, so they load in
parallel and the orchestrator stays light. The run's parts, in their order:
run_start.py (the environment, the helper's plan, run.start), protection.py
(what the program may not change; the evidence checked after),
run_held.py (the held layer), stage_forks.py (the recorder, the broker, the
relay, the asker), watch.py (the wait, with the phase table of phases.py),
outcome.py (the exit code).
"""
from __future__ import annotations

import os
import time

from stages.config.protected import Protection
from stages.orchestrator import protection as pn, run_held, run_start
from stages.orchestrator.held import HeldLayer
from stages.orchestrator.helper_first import (
    Helper, RunRefused, Terminal, abandon, open_the_log, send_plan,
)
from stages.orchestrator.own_lines import OwnLines
from stages.orchestrator.run_request import RunRequest
from stages.orchestrator.watch import RunWatch, StageLinks
from stages.record.run_file import RecordUnwritable, open_run_file
from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.startup.trace import mark
from stages.wire import status as st
from stages.wire.exits import ExitCode


def execute(request: RunRequest, terminal: Terminal, helper: Helper, say: OwnLines) -> int:
    """The run, its terminal planned and its helper forked first
    (helper_first.py); a run that ends before the plan is sent abandons the
    helper (it has made nothing yet)."""
    try:
        try:
            open_the_log(terminal, request.options.log)
        except RunRefused as exc:
            say(str(exc))
            return ExitCode.USAGE
        return _execute(request, terminal, helper, say)
    finally:
        abandon(helper)
        say.relay_say = None
        if terminal.relay is not None:
            terminal.relay.close()
        elif terminal.pty_socket is not None:
            for end in terminal.pty_socket:
                end.close()


class _Start(NamedTuple):
    """What the run worked out before the helper's plan was sent."""
    record: str
    run_id: str
    files_record: dict
    protected: Protection
    layer: HeldLayer | None
    names_before: dict           # evidence and pinned names -> (device, inode)
    env: dict                    # the program's environment
    env_kept: list


def _execute(request: RunRequest, terminal: Terminal, helper: Helper, say: OwnLines) -> int:
    started = time.monotonic()
    # The record is opened before anything starts: a run that cannot be
    # recorded is not run at all (docs/security.md, "The record is out of the program's reach").
    try:
        record, record_fd, run_id = open_run_file(request.options.record or None)
    except RecordUnwritable as exc:
        say(str(exc))
        return ExitCode.INTERNAL
    mark("vpnw", "record opened")
    start = _plan_the_helper(request, helper, record, run_id, say)
    # The record's modules (orjson) load only now, after the helper's plan:
    # the helper never needs them, and the recorder and the broker, forked
    # next, share them.
    from stages.record.events import Emitter
    from stages.record import event_types as ev   # as above
    from stages.orchestrator import stage_forks    # brings the record's gate: as above
    # Then the recorder: nothing is recorded that it does not see. The broker
    # dials only while the recorder holds room for the lines (record/gate.py).
    from stages.record.gate import RecordGate      # as above
    record_gate = RecordGate()
    stage_stdio = (0, 1, terminal.human_fd)
    recorder = stage_forks.start_recorder(request, terminal, record, record_fd, record_gate,
                                          stage_stdio)
    mark("vpnw", "recorder forked")
    emitter = Emitter(recorder.events_w, run_id, path=request.plan.path.name)
    run_start.warn_own_settings(request, start.env_kept, say)
    run_start.emit_run_start(emitter, request, record, start.files_record, start.env_kept,
                             start.protected, run_held.start_record(start.layer),
                             run_start.keys_given(start.env, request.plan.secrets))
    mark("vpnw", "run.start sent")
    for entry in start.protected.lifted:
        say(f"allow_write names {entry.path} ({entry.why}): the program may change it, "
            f"and what it writes there runs outside the sandbox later")
    pn.say_scan_cut(start.protected, say)

    broker = stage_forks.start_broker(request, terminal, helper, run_id, recorder.events_w,
                                      record_gate, stage_stdio)
    mark("vpnw", "broker forked")
    relay = stage_forks.start_relay(terminal, say) if terminal.pty else None
    asker = stage_forks.start_asker(request, broker.ask_link, run_id, relay, say)

    options = request.options
    run = RunWatch(StageLinks(helper.pid, broker.pid, recorder.pid, helper.status_r,
                              broker.status_r, helper.go_w, recorder.recorded_r),
                   emitter, say, request.plan.path.name,
                   hurry_recorder=bool(options.events_to or options.syslog), relay=relay,
                   asker=asker)
    code, error = run.wait()
    mark("vpnw", "stages reaped")
    code, error, held_nothing = _after_the_program(request, start, emitter, code, error, say)
    if relay is not None:
        relay.finish_program()

    totals = run.totals or st.Totals()
    emitter.emit(ev.RunEnd(exit_code=int(code), connections=totals.connections,
                           denied=totals.denied, would_deny=totals.would_deny, failed=totals.failed,
                           ms=round((time.monotonic() - started) * 1000, 3), error=error or None))
    # Marked before the close: the recorder's EOF (and so its "signed" mark)
    # can come before vpnw runs again after it.
    mark("vpnw", "run.end sent")
    os.close(recorder.events_w)
    run.reap()
    if held_nothing:
        run_held.remove_empty(start.layer)
    return stage_forks.wait_for_the_recorder(recorder.pid, relay, record, int(code), say)


def _plan_the_helper(request: RunRequest, helper: Helper, record: str, run_id: str,
                     say: OwnLines) -> _Start:
    """The protection, the held layer and the program's environment, then the
    plan sent to the helper forked first, which has done what needs no policy
    meanwhile. It reports ready and then waits for go, which comes only once
    the recorder has written run.start and the broker has checked the path
    (docs/architecture.md, "Start-up budget")."""
    files_plan, files_record = run_start.file_limits(request.plan.files)
    protected = pn.protection(request, record)
    layer = run_held.held_layer(request, run_id, say)
    if layer is not None:
        files_plan, protected = run_held.with_the_layer(layer, files_plan, protected)
    names_before = pn.identities(pn.evidence_names(request, record) + pn.pinned_names(protected))
    env, env_kept = run_start.program_env(request, run_id)
    mark("vpnw", "protection and environment computed")
    send_plan(helper, run_start.helper_plan(request, files_plan, env, protected, layer, say))
    return _Start(record, run_id, files_record, protected, layer, names_before, env, env_kept)


def _after_the_program(request: RunRequest, start: _Start, emitter, code: int,
                       error: str | None, say: OwnLines) -> tuple[int, str | None, bool]:
    """The evidence checked, what was held listed, new repositories named:
    (the exit code, the error, whether the held layer held nothing)."""
    moved = pn.after_the_program(start.protected, start.names_before, start.run_id, say)
    if moved:
        say(moved)
        code, error = ExitCode.INTERNAL, error or moved
    held_nothing = start.layer is not None and run_held.what_was_held(
        request, start.layer, start.run_id, emitter, say)
    pn.say_new_repositories(request, start.record, start.protected, say)
    return code, error, held_nothing

"""The stages forked after the helper's plan, in their order: the recorder
(nothing happens that it does not see), then the broker once run.start is
on the event pipe, then the program's terminal relay and guard --ask's
asker; and, at the end, the recorder's end waited for. Each stage is forked
from this single-threaded process and runs its own `main_from_fds`; its
heavy modules load only after the fork, so they load in parallel."""
from __future__ import annotations

import os

from stages.orchestrator.helper_first import Helper, Terminal, fork_stage
from stages.orchestrator.run_request import RunRequest
from stages.record.run_file import vpnw_state_dir
from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.startup.trace import mark
from stages.wire.exits import ExitCode


class RecorderLinks(NamedTuple):
    pid: int
    events_w: int      # the event pipe's write end (the emitter's, then the broker's)
    recorded_r: int    # one byte once run.start is in the record


class BrokerLinks(NamedTuple):
    pid: int
    status_r: int
    ask_link: object   # guard --ask: the socketpair to the asker, else None


def start_recorder(request: RunRequest, terminal: Terminal, record: str, record_fd: int,
                   record_gate, stage_stdio) -> RecorderLinks:
    """The recorder, forked first: nothing happens that it does not see."""
    events_r, events_w = os.pipe()
    recorded_r, recorded_w = os.pipe()
    options = request.options
    human = "denials" if options.quiet else {"trace": "trace"}.get(options.mode, "run")

    def recorder_body():
        mark("recorder", "forked")
        # The recorder's own modules load in its fork, beside vpnw's.
        from stages.recorder.main import main_from_fds
        return main_from_fds(events_r, record=record, record_fd=record_fd, ready_fd=recorded_w,
                             human=human, tee_command=options.events_to, color=terminal.color,
                             syslog_target=options.syslog, events_format=options.events_format,
                             record_gate=record_gate, sign=True,
                             errors_said=not options.log)   # say() writes on the same stream

    recorder_pid = fork_stage([events_r, record_fd, recorded_w], recorder_body, stdio=stage_stdio)
    for fd in (events_r, record_fd, recorded_w):
        os.close(fd)
    return RecorderLinks(recorder_pid, events_w, recorded_r)


def start_broker(request: RunRequest, terminal: Terminal, helper: Helper, run_id: str,
                 events_w: int, record_gate, stage_stdio) -> BrokerLinks:
    """The broker, once run.start is on the event pipe (its path.check comes
    after it), on the handoff link's far end; the pipes status comes on."""
    broker_end = helper.broker_end      # an fd
    broker_status_r, broker_status_w = os.pipe()
    ask_link = _ask_link(request)
    plan = request.plan

    def broker_body():
        mark("broker", "forked")
        # The broker's own modules (asyncio) load in its fork, beside vpnw's.
        from stages.broker.main import main_from_fds
        return main_from_fds(broker_end, events_w, broker_status_w, run_id=run_id,
                             policy=plan.policy, path=plan.path,
                             dry_run=request.options.dry_run, record_gate=record_gate,
                             ask_fd=ask_link[1].fileno() if ask_link else None,
                             capture=plan.capture, secrets=plan.secrets)

    broker_pid = fork_stage([broker_end, events_w, broker_status_w,
                             *([ask_link[1].fileno()] if ask_link else [])], broker_body,
                            stdio=stage_stdio)
    for fd in (broker_status_w, broker_end, *terminal.own_fds):
        os.close(fd)
    return BrokerLinks(broker_pid, broker_status_r, ask_link)


def _ask_link(request: RunRequest):
    """guard --ask: the broker's link to the one place that asks (asker.py)."""
    if not request.plan.ask:
        return None
    import socket    # only guard --ask needs a socketpair
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def start_relay(terminal: Terminal, say):
    """The relay, waiting for the pty's master: the helper makes the pty in
    the sandbox's own devpts and sends the master over the socket. Until it
    comes (or if it never does: the helper failed first) vpnw's lines still
    flow through the relay."""
    # Only a run on a terminal relays one.
    from stages.orchestrator.terminal import TerminalRelay
    ours, helpers = terminal.pty_socket
    helpers.close()
    terminal.pty_socket = None
    keys = terminal.on_tty[0]
    terminal.relay = TerminalRelay(0 if keys else terminal.program_out, terminal.program_out, None,
                                   terminal.human_r, master_from=ours, keys=keys,
                                   no_clipboard=terminal.no_clipboard)
    say.relay_say = terminal.relay.say
    return terminal.relay


def start_asker(request: RunRequest, ask_link, run_id: str, relay, say):
    if ask_link is None:
        return None
    ask_link[1].close()
    # Only guard --ask asks.
    from stages.orchestrator.asker import Asker
    return Asker(run_id=run_id, broker_end=ask_link[0], policy=request.plan.policy, relay=relay,
                 say=say, timeout=request.options.ask_timeout, state_dir=vpnw_state_dir(),
                 program=os.path.basename(request.options.program[0]))


def wait_for_the_recorder(recorder_pid: int, relay, record: str, code: int, say) -> int:
    """vpnw's last lines through the terminal, then the recorder's end: a
    recorder that failed makes the run vpnw's failure (125)."""
    if relay is not None:
        recorder_fd = os.pidfd_open(recorder_pid)
        try:
            relay.finish_human(recorder_fd)
        finally:
            os.close(recorder_fd)
    _, status = os.waitpid(recorder_pid, 0)
    mark("vpnw", "recorder reaped")
    if os.waitstatus_to_exitcode(status) != 0 and code != ExitCode.INTERNAL:
        say(f"the recorder failed; the record {record} may be incomplete")
        return ExitCode.INTERNAL
    return code

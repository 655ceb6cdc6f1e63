"""What the helper and the broker reported during a run, taken in message by
message through the phase table (phases.py): each channel's phase, the
reports outcome.py turns into vpnw's exit code, and the events the messages
put in the record."""
from __future__ import annotations

from stages.orchestrator import outcome
from stages.orchestrator.phases import FIRST_PHASE, OVER, RUNNING, SEALED, step
from stages.startup.trace import mark
from stages.wire import status as st
from stages.wire.exits import ExitCode


class StageReports:
    """The stages' reports so far, and each channel's phase."""

    def __init__(self, emitter, relay=None):
        self.emitter = emitter
        self.relay = relay
        self.phase = dict(FIRST_PHASE)
        self.started = False         # go sent: the program was let run
        self.ready = None            # the helper's seal report (st.Ready)
        self.path_ok = None          # None until the broker has checked the path
        self.path_down = None        # st.PathDown, or a message when the broker said nothing
        self.program_exit = None     # st.Exited
        self.exec_error = None       # st.ExecFailed
        self.seal_error = None       # message: the sandbox could not be built (122)
        self.totals = None           # st.Totals
        self.fatal = None            # a stage died or broke the protocol: message (125)
        self.refused = None          # a stage's message was refused: message (125, first of all)
        self.interrupted = None      # a signal that came before the program started
        self.loopback_refused = []   # ports refused inside that the machine listens on

    def over(self, stage: str) -> bool:
        return self.phase[stage] == OVER

    def take(self, stage: str, message) -> None:
        """One message from a stage, checked against its phase, then taken;
        StatusError when it may not come now or does not hold."""
        follows = step(self.phase[stage], message).follows
        mark("vpnw", f"{stage}: {type(message).__name__}")
        problem = self._HANDLERS[type(message)](self, message)
        if problem:
            raise st.StatusError(problem)
        self.phase[stage] = follows

    def go_sent(self) -> None:
        self.started = True
        if self.phase["helper"] == SEALED:
            self.phase["helper"] = RUNNING

    def reports(self, path_name: str) -> outcome.Reports:
        return outcome.Reports(
            path_name=path_name, started=self.started, path_ok=self.path_ok,
            path_down=self.path_down, seal_error=self.seal_error, fatal=self.fatal,
            refused=self.refused, interrupted=self.interrupted, exec_error=self.exec_error,
            program_exit=self.program_exit, totals=self.totals)

    # Each handler runs only in a phase the table allows; it records the report.
    def _on_ready(self, message: st.Ready) -> None:
        self.ready = message
        from stages.record import event_types as ev    # loads orjson: after the helper's plan (run.py)
        self.emitter.emit(ev.SandboxReady(namespaces=list(message.namespaces), seccomp=message.seccomp,
                                          unix_sockets=message.unix_sockets, unix=message.unix,
                                          doors=dict(message.doors),
                                          local_doors=list(message.local) or None))

    def _on_unix(self, message: st.UnixConnect) -> str | None:
        if self.ready.unix != "own":
            return "a Unix-socket report from a sandbox without the supervisor"
        from stages.record import event_types as ev    # loads orjson: after the helper's plan (run.py)
        said = dict(path=message.path, process=message.process, program=message.program)
        self.emitter.emit(ev.UnixAllow(**said, rule=message.reason) if message.allowed
                          else ev.UnixDeny(**said, reason=message.reason))
        return None

    def _on_loopback_refused(self, message: st.LoopbackRefused) -> str | None:
        """Evidence for the closing hint: a port nothing inside listens on,
        kept when the machine (this network namespace) has a listener there
        that a `localhost:PORT` rule would reach."""
        if self.ready.unix != "own":
            return "a loopback report from a sandbox without the supervisor"
        if message.port in self.loopback_refused or len(self.loopback_refused) >= 16:
            return None
        # Only a refused loopback connect asks the kernel's socket table.
        from stages.kernel.inet_diag import DiagError, loopback_listener
        try:
            if loopback_listener(message.port):
                self.loopback_refused.append(message.port)
        except (OSError, DiagError):
            pass                     # no evidence, no hint
        return None

    def _on_stopped(self, message: st.Stopped) -> str | None:
        if self.relay is None:
            return "a stop report without a terminal"
        self.relay.program_stopped(message.signal)
        return None

    def _on_sandbox_failed(self, message: st.SandboxFailed) -> None:
        if message.code == ExitCode.NO_SANDBOX:
            self.seal_error = message.error
        else:   # the helper itself failed: vpnw's fault, not the machine's
            self.fatal = self.fatal or message.error

    def _on_exec_failed(self, message: st.ExecFailed) -> None:
        self.exec_error = message

    def _on_exited(self, message: st.Exited) -> None:
        self.program_exit = message
        from stages.record import event_types as ev    # loads orjson: after the helper's plan (run.py)
        self.emitter.emit(ev.ProgramExit(code=message.code, signal=message.signal,
                                         no_route=message.no_route or None,
                                         loopback_refused=self.loopback_refused or None))

    def _on_path_report(self, message: st.PathOk | st.PathDown) -> None:
        self.path_ok = isinstance(message, st.PathOk)
        if not self.path_ok:
            self.path_down = message

    def _on_totals(self, message: st.Totals) -> None:
        self.totals = message

    _HANDLERS = {st.Ready: _on_ready, st.Stopped: _on_stopped, st.UnixConnect: _on_unix,
                 st.LoopbackRefused: _on_loopback_refused,
                 st.SandboxFailed: _on_sandbox_failed,
                 st.ExecFailed: _on_exec_failed, st.Exited: _on_exited,
                 st.PathOk: _on_path_report, st.PathDown: _on_path_report, st.Totals: _on_totals}

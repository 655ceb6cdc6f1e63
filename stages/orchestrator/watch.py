"""The run's wait: the stages' status pipes, the signals, the terminal relay
and guard --ask's asker in one select loop, until the stages have said their
last; the go sent once the path is up, the seal holds and run.start is
recorded; vpnw's exit code from what they reported (outcome.py)."""
from __future__ import annotations

import os
import signal
import time

from stages.orchestrator import outcome
from stages.orchestrator.helper_first import FORWARDED_SIGNALS
from stages.orchestrator.stage_reports import StageReports
from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.startup.trace import mark
from stages.wire import status as st

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
HURRY_SIGNAL = signal.SIGURG


class StageLinks(NamedTuple):
    """The forked stages and the ends of their pipes the run holds."""
    helper_pid: int
    broker_pid: int
    recorder_pid: int
    helper_status_r: int
    broker_status_r: int
    go_w: int            # one byte (st.GO) lets the program run; EOF makes the helper give up
    recorded_r: int      # one byte once run.start is in the record


class RunWatch:
    """Waits for the stages and turns what they report into vpnw's exit code."""

    def __init__(self, links: StageLinks, emitter, say, path_name: str, *,
                 hurry_recorder: bool = False, relay=None, asker=None):
        self.say = say
        self.path_name = path_name
        self.hurry_recorder = hurry_recorder     # --events-to or --syslog: no grace when told to stop
        self.relay = relay
        self.asker = asker           # guard --ask (asker.py)
        self.reports = StageReports(emitter, relay)
        self.pids = {"helper": links.helper_pid, "broker": links.broker_pid,
                     "recorder": links.recorder_pid}
        self.helper = st.StatusReader(links.helper_status_r, st.HELPER_STATUS)
        self.broker = st.StatusReader(links.broker_status_r, st.BROKER_STATUS)
        self.go_w = links.go_w
        self.recorded_r = links.recorded_r
        self.recorded = False
        self.pending_signals: list[int] = []

    @property
    def totals(self) -> st.Totals | None:
        return self.reports.totals

    def _on_signal(self, signum, _frame):
        self.pending_signals.append(signum)

    def _forward_signals(self):
        r = self.reports
        while self.pending_signals:
            sig = self.pending_signals.pop(0)
            if sig == signal.SIGWINCH:
                self.relay.resize()
                continue
            if sig == signal.SIGCONT:
                self.relay.resumed()
                continue
            if sig in STOP_SIGNALS and self.hurry_recorder:
                # Told to stop: side outputs (--events-to) get no grace at the
                # end. SIGURG because its default action is to be ignored: a
                # recorder that has not set its handler yet is not killed.
                self._kill("recorder", HURRY_SIGNAL)
            if r.started and r.program_exit is None:
                self._kill("helper", sig)
            elif not r.started:
                r.interrupted = r.interrupted or sig
                r.fatal = r.fatal or f"interrupted by signal {sig} before the program started"

    def _kill(self, stage: str, sig: int) -> None:
        try:
            os.kill(self.pids[stage], sig)
        except ProcessLookupError:
            pass

    def wait(self) -> tuple[int, str | None]:
        caught = FORWARDED_SIGNALS + ((signal.SIGWINCH, signal.SIGCONT) if self.relay else ())
        old = {sig: signal.signal(sig, self._on_signal) for sig in caught}
        if self.relay is None and self.asker is None:
            from stages.orchestrator import fd_wait as selectors    # no selectors module
        else:
            import selectors    # only now: vpnw's own, after every stage is forked
        sel = selectors.DefaultSelector()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        try:
            if self.relay is not None:
                self.relay.start(sel)
            if self.asker is not None:
                self.asker.start(sel)
            sel.register(self.helper.fd, selectors.EVENT_READ, "helper")
            sel.register(self.broker.fd, selectors.EVENT_READ, "broker")
            sel.register(wake_r, selectors.EVENT_READ, "signal")
            sel.register(self.recorded_r, selectors.EVENT_READ, "recorded")
            recorder_fd = os.pidfd_open(self.pids["recorder"])
            sel.register(recorder_fd, selectors.EVENT_READ, "recorder")
            while True:
                timeout = self.relay.timeout(time.monotonic(), 1.0) if self.relay else 1.0
                if self.asker is not None:
                    timeout = self.asker.timeout(time.monotonic(), timeout)
                for key, events in sel.select(timeout=timeout):
                    self._ready(sel, key, events, wake_r, recorder_fd)
                if self.relay is not None:
                    self.relay.tick()
                if self.asker is not None:
                    self.asker.tick()
                self._forward_signals()
                self._advance()
                if self._done():
                    break
        finally:
            if self.asker is not None:
                self.asker.close()
            if self.relay is not None:
                self.relay.detach()
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in old.items():
                signal.signal(sig, handler)
            sel.close()
            os.close(wake_r)
            os.close(wake_w)
            os.close(self.recorded_r)
            os.close(recorder_fd)
        self._stop_the_broker()
        return self._exit_code()

    def _ready(self, sel, key, events, wake_r: int, recorder_fd: int) -> None:
        """One file the select found ready."""
        if key.data.startswith("pty:"):
            self.relay.handle(key.data, events)
        elif key.data.startswith("ask:"):
            self.asker.handle(key, events)
        elif key.data == "signal":
            os.read(wake_r, 512)
        elif key.data == "recorded":
            self.recorded = os.read(self.recorded_r, 1) == b"r" or self.recorded
            mark("vpnw", "run.start recorded")
            sel.unregister(self.recorded_r)
        elif key.data == "recorder":
            sel.unregister(recorder_fd)
            r = self.reports
            if r.totals is None:
                r.fatal = r.fatal or ("the recorder stopped; vpnw stops the program rather than "
                                      "run it unrecorded")
        else:
            reader = self.helper if key.data == "helper" else self.broker
            self._read(key.data, reader)
            if reader.eof:
                mark("vpnw", f"{key.data}'s status ended")
                sel.unregister(reader.fd)
                self._on_eof(key.data)

    def _read(self, stage: str, reader: st.StatusReader) -> None:
        """Every message the stage sent, each checked against what may come now."""
        r = self.reports
        try:
            for message in reader.messages():
                r.take(stage, message)
        except st.StatusError as exc:
            # Nothing more from this stage is believed: stop it and the run (fail closed).
            reader.eof = True
            r.refused = r.refused or (f"the {stage} sent a status message vpnw does not "
                                      f"accept ({exc}); vpnw stopped the run")
            r.fatal = r.fatal or r.refused
            self._kill(stage, signal.SIGKILL)

    def _on_eof(self, stage):
        r = self.reports
        if stage == "helper" and not r.over("helper") and not r.fatal:
            if not r.started and r.ready is None:
                r.seal_error = ("the sandbox helper stopped before the seal was ready; the program was not run "
                                "(run `vpnw doctor` to see what this machine supports)")
            elif r.started:
                r.fatal = "the helper died during the run; the program is gone with it"
        if stage == "broker" and r.totals is None:
            r.fatal = r.fatal or "the broker stopped during the run; its connections failed"
            if r.path_ok is None:
                r.path_ok = False
                r.path_down = "the broker stopped before it checked the path"

    def _advance(self):
        """Start the program once the path is up and the seal holds; stop it on a fatal error."""
        r = self.reports
        if self.relay is not None and self.relay.master_refused and not r.fatal:
            r.fatal = (f"the sandbox did not hand over the program's terminal "
                       f"({self.relay.master_refused}); the program was not run")
        if not r.started and self.go_w is not None:
            if r.path_ok is False or r.seal_error or r.fatal:
                os.close(self.go_w)  # EOF: the helper gives up without running anything
                self.go_w = None
            elif r.path_ok and r.ready is not None and self.recorded and \
                    (self.relay is None or not self.relay.awaiting_master()):
                mark("vpnw", "go")
                os.write(self.go_w, st.GO)
                os.close(self.go_w)
                self.go_w = None
                r.go_sent()
                if self.relay is not None:
                    self.relay.program_started()
        if r.fatal and r.started and r.program_exit is None:
            self._kill("helper", signal.SIGKILL)

    def _done(self) -> bool:
        r = self.reports
        helper_over = self.helper.eof
        broker_over = self.broker.eof
        if not r.started:
            # Interrupted: do not wait for a path check to finish; _reap stops the broker.
            return helper_over and (broker_over or r.path_ok is not None or bool(r.interrupted))
        # The helper's last message comes once init and the supervisor are
        # reaped (the sandbox's processes are all gone), the broker's Totals
        # last of all: neither needs their process's exit to be waited for
        # first (reap() comes after run.end).
        return (helper_over or r.over("helper")) and (broker_over or r.totals is not None)

    def _stop_the_broker(self):
        if not self.broker.eof and self.reports.totals is None:
            self._kill("broker", signal.SIGTERM)

    def reap(self):
        """The helper's and the broker's exit, once they have said their last."""
        for name in ("helper", "broker"):
            os.waitpid(self.pids[name], 0)

    def _exit_code(self) -> tuple[int, str | None]:
        code, message = outcome.exit_code(self.reports.reports(self.path_name))
        if message is not None:
            self.say(message)
        return code, message

"""The recorder: events in (JSON Lines on a pipe), the run file and human lines out.

Forked by the orchestrator, which calls `main_from_fds`; `python -m
stages.recorder` runs it alone (replaying a run file reproduces its human
lines). Imports stay light: this runs in a fork of the orchestrator, and the
tee's `subprocess` is loaded only when asked for.
"""
from __future__ import annotations

import os
import signal
import stat
import time

import orjson

from stages.record.events import RecordError, RecordUnwritable, open_run_file, parse_line, split_digest
from stages.record.chain import Chain, unchained
from stages.recorder import say as _say
from stages.recorder.hints import RunFacts
from stages.recorder.human import HUMAN_MODES, QUIET, HumanState, LiveOrder, format_event
from stages.recorder.reserve import RecordRoom
from stages.startup.c_halves import in_a_thread
from stages.startup.trace import mark

# A line longer than this with no newline is not an event; drop it rather
# than let a broken writer grow our buffer without end.
_MAX_PENDING = 1 << 20


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class _RunFile:
    """The run file: every line whole, or the run stops.

    A write that fails (disk full, `--record -` reader gone) is undone back to
    the last whole line where the file allows it (ftruncate; a pipe takes a
    line of at most PIPE_BUF in one piece or not at all). The lines of one
    read go to a file in one write: a busy run's recorder makes one system
    call per batch, not one per event."""

    def __init__(self, fd: int, name: str):
        self.fd = fd
        self.name = name
        try:
            self.offset = os.lseek(fd, 0, os.SEEK_CUR)
        except OSError:
            self.offset = None    # a pipe or a terminal

    def write_lines(self, lines: list[bytes]) -> None:
        """A file takes the lines read together in one write (undone to the
        last whole line if it fails); a pipe or a terminal, one write per
        line, each at most PIPE_BUF and so whole or absent."""
        if self.offset is None:
            for line in lines:
                _write_all(self.fd, line)
            return
        data = b"".join(lines)
        try:
            _write_all(self.fd, data)
        except OSError:
            try:
                os.ftruncate(self.fd, self.offset)
            except OSError:
                pass
            raise
        self.offset += len(data)


class _Tee:
    """The same lines to a command's stdin (`--events-to 'jq -c .'`), through
    a BoundedFeeder: a consumer that is slow or stuck loses lines (counted),
    never holds the recorder and so never holds the program."""

    # At the end of the run, the backlog gets this long to go out (less if the
    # consumer takes nothing for IDLE), then the command gets EXIT_GRACE to
    # finish on its own before it is stopped. Interrupted runs (SIGTERM to
    # the recorder) give neither.
    DRAIN_GRACE = 1.0
    IDLE = 0.25
    EXIT_GRACE = 2.0

    def __init__(self, command: str):
        import subprocess       # only for --events-to (its command)

        # Only for a copy (~0.6 ms of CPU with select's, on the way to run.start otherwise).
        from stages.recorder.feeder import BoundedFeeder
        # A dead reader must give EPIPE here, not kill the recorder.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self._subprocess = subprocess
        # Its own process group: a `sh -c` whose child never reads is stopped whole.
        self.proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE,
                                     stdout=None, stderr=None, close_fds=True, process_group=0)
        self.feeder = BoundedFeeder(self.proc.stdin.fileno())
        self.command = command
        self.hurry = False
        self._said_lost = False

    @property
    def fd(self) -> int:
        return self.feeder.fd

    def wants_write(self) -> bool:
        return self.feeder.wants_write()

    def write(self, data: bytes) -> None:
        was_open = not self.feeder.closed
        self.feeder.offer(data)
        self.feeder.pump()
        self._notice(was_open)

    def pump(self) -> None:
        was_open = not self.feeder.closed
        self.feeder.pump()
        self._notice(was_open)

    def _notice(self, was_open: bool) -> None:
        if was_open and self.feeder.closed:
            exc = self.feeder.error
            _say(f"--events-to command {self.command!r} stopped reading "
                 f"({(exc.strerror if exc else None) or exc}); the run is still recorded to its file")
        elif self.feeder.lost and not self._said_lost and not self.feeder.closed:
            self._said_lost = True
            _say(f"--events-to command {self.command!r} is not keeping up; events it cannot take "
                 "are dropped from its copy (counted in run.end), never from the record")

    def lost_before_end(self) -> int:
        """Before run.end: a last bounded chance for the backlog, then what
        the copy lost so far (run.end's events_to_lost)."""
        if not self.hurry:
            was_open = not self.feeder.closed
            self.feeder.drain(time.monotonic() + self.DRAIN_GRACE, self.IDLE)
            self._notice(was_open)
        self.feeder.drop_pending()
        return self.feeder.lost

    def close(self) -> None:
        if self.feeder.wants_write() and not self.hurry:
            self.feeder.drain(time.monotonic() + self.IDLE, self.IDLE)
        undelivered = self.feeder.drop_pending() if not self.feeder.closed else 0
        self.feeder.close()
        self.proc.stdin = None   # closed through the feeder
        try:
            self.proc.wait(timeout=0 if self.hurry else self.EXIT_GRACE)
            stopped = False
        except self._subprocess.TimeoutExpired:
            # It had its end of stream; a command that will not finish is ours to stop.
            stopped = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if undelivered or stopped:
            _say(f"--events-to command {self.command!r} "
                 + (f"did not take its last {undelivered} events; " if undelivered else "")
                 + ("was stopped: it had not finished after the run ended" if stopped
                    else "the run file is complete"))


def _with_fields(raw: bytes, **extra) -> bytes:
    """The event re-encoded with `extra` in its fields and no digest (the
    chain seals it again)."""
    event = orjson.loads(raw)
    event.pop("d", None)
    event["fields"].update(extra)
    return orjson.dumps(event)


def _open_syslog(target: str | None, events_format: str):
    if target is None:
        return None
    from stages.recorder.shipping.transports import TargetError    # only for --syslog
    from stages.recorder.syslog_out import SyslogOut    # only for --syslog
    try:
        return SyslogOut(target, events_format)
    except TargetError as exc:
        _say(f"--syslog: {exc}; nothing is sent to syslog")
        return None


def main_from_fds(in_fd: int, *, record: str | None, record_fd: int | None = None,
                  ready_fd: int | None = None, human: str = "trace",
                  tee_command: str | None = None, color: bool | None = None,
                  syslog_target: str | None = None, events_format: str = "jsonl",
                  record_gate=None, sign: bool = False, errors_said: bool = False) -> int:
    """Record events from `in_fd` until end of stream. Returns an exit code:
    0, or 1 when the record file could not be opened or written (then it stops
    at once: the orchestrator stops the program rather than run it unrecorded).

    `record_fd` is the record already opened by the orchestrator (`record`
    then only names it); `ready_fd` gets one byte once the first line is in
    the record, and is closed: the program starts only after that.

    The side outputs (`tee_command`, `syslog_target`) carry `events_format`:
    the record's lines ("jsonl"), or OCSF/ECS documents.

    `errors_said`: the orchestrator says the run's error on the same stream
    as these human lines (HumanState.errors_said).

    `sign`: once the events end, sign a run file (a regular file) with vpnw's
    key and enter it in the ledger (stages/recorder/seal.py); a key or a
    ledger that cannot be used makes this return 1 before the first line."""
    mark("recorder", "imported")
    if human not in HUMAN_MODES:
        raise ValueError(f"human must be one of {HUMAN_MODES}, not {human!r}")
    if color is None:
        color = "NO_COLOR" not in os.environ and os.isatty(2)
    state = HumanState(mode=human, color=color, record=record, facts=RunFacts(),
                       errors_said=errors_said)
    if record_fd is None and record is not None:
        try:
            record, record_fd, _ = open_run_file(record)
        except RecordUnwritable as exc:
            _say(str(exc).replace("the program was not run", "nothing was recorded"))
            return 1
    run_file = _RunFile(record_fd, record) if record_fd is not None else None
    sealer = room = None
    if run_file is not None:
        sealer = _open_sealer(run_file) if sign else None
        mark("recorder", "key and ledger opened")
        room = _reserve_room(run_file, record, in_fd, record_gate) if sealer is not False else None
        mark("recorder", "room reserved")
        if sealer is False or room is None:
            os.close(run_file.fd)
            return 1
    elif record_gate is not None:
        record_gate.open()
    recorder = _Recorder(record, run_file, room, sealer, state, ready_fd)
    recorder.open_side_outputs(tee_command, syslog_target, events_format)
    try:
        status = recorder.record_from(in_fd)
    finally:
        recorder.close()
    return status


def _reserve_room(run_file: _RunFile, record, in_fd: int, record_gate) -> RecordRoom | None:
    """Room reserved before the first line, the broker's gate open only then
    (record/gate.py): a full disk never hides a connection. None: said why."""
    room = RecordRoom(run_file.fd, run_file.offset, in_fd, record_gate)
    error = room.start(run_file.offset)
    if error is None:
        return room
    _say(f"cannot reserve room for the record {record}: {error.strerror or error}; "
         "fix: free space on its file system, or give --record a file elsewhere; "
         "the program was not run")
    return None


class _Recorder:
    """One run's recording: lines sealed into the chain, into the run file
    first, then into the side outputs and the human lines."""

    def __init__(self, record, run_file, room, sealer, state: HumanState, ready_fd):
        self.record, self.run_file, self.room, self.sealer = record, run_file, room, sealer
        self.state, self.ready_fd = state, ready_fd
        self.tee = self.tee_render = self.syslog = None
        self.sides: list = []
        self.chain = Chain()
        self.first = self.last = None     # the first and the last event recorded (the seal names them)
        self.bad_lines = 0
        self.live_order = LiveOrder()

    def open_side_outputs(self, tee_command, syslog_target, events_format: str) -> None:
        if tee_command:
            try:
                self.tee = _Tee(tee_command)
            except OSError as exc:
                _say(f"cannot start --events-to command {tee_command!r}: {exc.strerror or exc}")
        if self.tee is not None and events_format != "jsonl":
            from stages.recorder.shipping import stream_renderer    # only for another format
            self.tee_render = stream_renderer(events_format)
        self.syslog = _open_syslog(syslog_target, events_format)
        self.sides = [side for side in (self.tee, self.syslog) if side is not None]
        if self.sides:
            sides = self.sides

            def hurry(_signum, _frame):
                for side in sides:
                    side.hurry = True
            # The orchestrator was told to stop: the copy gets no grace at the end
            # (SIGURG: ignored by default, so harmless before this handler is set).
            signal.signal(signal.SIGURG, hurry)

    def record_from(self, in_fd: int) -> int:
        """Until the end of the stream: 0, or 1 when the run file refused a line."""
        room, pending = self.room, b""
        while True:
            if room is not None and room.drained:
                return 1    # the gate is closed and every dial's line is written: stop
            if any(side.wants_write() for side in self.sides):
                _wait_readable(in_fd, self.sides)
            chunk = os.read(in_fd, 65536)
            if room is not None:
                room.read(len(chunk))
            if not chunk:
                mark("recorder", "events ended")
                if not pending.strip():
                    break
                # A last line with no newline (a hand-written file); a torn
                # line from a killed writer fails to parse and is skipped.
                lines, pending = [pending], b""
            else:
                pending += chunk
                if b"\n" not in chunk:
                    if len(pending) > _MAX_PENDING:
                        pending = b""
                        self.bad_lines += 1
                    continue
                *lines, pending = pending.split(b"\n")
            while lines:
                sealed, lines = self.seal(lines)
                if sealed and not self.take(sealed):
                    return 1
        if self.sealer is not None and self.first is not None:
            given_back = self._give_back_room()
            status = _seal(self.sealer, self.run_file, self.first, self.last, self.chain, self.syslog)
            given_back()
            mark("recorder", "signed")
            return status
        return 0

    def _give_back_room(self):
        """The room reserved past the last line, given back while the file is
        signed, not after (close() then finds none left): on ext4 that
        ftruncate mostly waits (0.4-4 ms, ~0.15 ms of CPU), on the way to
        vpnw's exit. It does not change the file's size, so neither does
        what is signed. Returns the wait for it (docs/architecture.md,
        "Start-up budget")."""
        room, offset = self.room, self.run_file.offset
        if room is None or offset is None:
            return lambda: None
        # In a thread of its own (startup/c_halves.py: without threading's import).
        return in_a_thread(lambda: room.finish(offset))

    def seal(self, lines: list[bytes]) -> tuple[list[tuple[dict, bytes]], list[bytes]]:
        """(event, its line sealed into the chain) for each line that is an
        event, and the lines left for the next batch: run.end starts a batch
        of its own, so every event before it has reached the copies when its
        losses are counted (a batch is copied out only once it is sealed)."""
        sealed = []
        for at, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                event = parse_line(raw)
            except RecordError as exc:
                self.bad_lines += 1
                if self.bad_lines == 1:
                    _say(f"skipping a line that is not a version-1 event ({exc})")
                continue
            if self.sides and event["type"] == "run.end":
                if sealed:
                    return sealed, lines[at:]
                losses = {}
                if self.tee is not None:
                    losses["events_to_lost"] = self.tee.lost_before_end()
                if self.syslog is not None:
                    losses["syslog_lost"] = self.syslog.lost_before_end()
                event["fields"].update(losses)
                raw = _with_fields(raw, **losses)
            elif "d" in event:
                raw = unchained(raw)
            sealed.append((event, self.chain.seal(raw.rstrip()) + b"\n"))
        return sealed, []

    def take(self, sealed: list[tuple[dict, bytes]]) -> bool:
        """Into the record first, then the copies: a copy never holds a line
        the record lacks. False when the run file refused them."""
        if self.run_file is not None and not _into_the_record(self.run_file, self.room, sealed,
                                                              self.record):
            return False
        if self.ready_fd is not None:
            _signal_ready(self.ready_fd)
            self.ready_fd = None
        if self.first is None:
            self.first = sealed[0][0]
        self.last = sealed[-1][0]
        for event, line in sealed:
            self.copy_out(event, line)
        if self.syslog is not None:
            self.syslog.after_batch(sealed)     # the chain's head, when one is due
        return True

    def copy_out(self, event: dict, line: bytes) -> None:
        # Side outputs carry the line as recorded, digest included: a copy
        # kept elsewhere anchors the chain (docs/record.md).
        if self.tee is not None:
            if self.tee_render is None:
                self.tee.write(line)
            else:
                for doc in self.tee_render(event, line):
                    self.tee.write(doc + b"\n")
        if self.syslog is not None:
            self.syslog.write(event, line[:-1])
        if self.state.mode == QUIET:
            return
        if event.get("type") == "run.end":
            # The summary names the last digest: the user can hold the
            # record to it later (`vpnw show --verify` prints it too).
            split = split_digest(line[:-1])
            self.state.digest = split[1].decode() if split else None
        self.say(self.live_order.feed(event))

    def say(self, events: list[dict]) -> None:
        """The human lines of these events, in the order given (LiveOrder's)."""
        for event in events:
            text = format_event(event, self.state)
            if text is not None:
                try:
                    _write_all(2, (text + "\n").encode("utf-8", "replace"))
                except OSError:
                    pass

    def close(self) -> None:
        self.say(self.live_order.flush())     # a cut run's program.exit, still held
        if self.run_file is not None:
            self.room.finish(self.run_file.offset)
            os.close(self.run_file.fd)
        if self.ready_fd is not None:
            os.close(self.ready_fd)
        if self.tee is not None:
            self.tee.close()
        if self.syslog is not None:
            self.syslog.close()
        if self.bad_lines > 1:
            _say(f"{self.bad_lines} lines were not version-1 events and were not recorded")


def _into_the_record(run_file: _RunFile, room: RecordRoom, sealed: list, record) -> bool:
    """The sealed lines into the run file, room kept ahead of them; False
    when the file refused them (the recorder stops)."""
    lines = [line for _, line in sealed]
    offset = run_file.offset
    full = room.before_write(None if offset is None else offset + sum(map(len, lines)))
    if full is not None:
        _say(f"the record {record} cannot grow ({full.strerror or full}): vpnw refuses every "
             "new connection and stops the run; every connection made is in the record")
    try:
        run_file.write_lines(lines)
    except OSError as exc:
        room.shut()
        _say(f"cannot write the record {record}: {exc.strerror or exc}; "
             "vpnw stops the run rather than run the program unrecorded "
             "(the lines written are whole)")
        return False
    return True


def last_line(chain: Chain) -> bytes:
    """A stand-in line carrying the chain's head (what SyslogOut.head reads)."""
    return b'{,"d":"' + chain.prev + b'"}'


def _open_sealer(run_file: _RunFile):
    """The key and the ledger for a run file (None: not a regular file, so
    nothing to sign; False: they cannot be used, said)."""
    if run_file.offset is None or not stat.S_ISREG(os.fstat(run_file.fd).st_mode):
        return None     # before the imports: `--record -` never loads the signing code
    from stages.recorder.seal import Sealer    # a file record's only (the line above)
    from stages.record.signing import KeyProblem    # a file record's only
    try:
        return Sealer.open()
    except (KeyProblem, OSError) as exc:
        _say(f"{exc}; a run that cannot be signed is not run: the program was not run")
        return False


def _seal(sealer, run_file: _RunFile, first: dict, last: dict, chain: Chain, syslog=None) -> int:
    try:
        _sig, seq, ledger_d = sealer.seal(run_file.fd, run_file.name, first, last, chain.prev.decode())
        if syslog is not None:
            syslog.sealed(last_line(chain), last.get("ts"), seq, ledger_d, sealer.key.id_text)
    except Exception as exc:     # noqa: BLE001 - said, and the run ends 125 (fail closed)
        _say(f"cannot sign the record {run_file.name} or enter it in the ledger: {exc}; "
             "the record itself is whole")
        return 1
    return 0


def _signal_ready(fd: int) -> None:
    mark("recorder", "run.start written")
    try:
        os.write(fd, b"r")
    except OSError:
        pass
    os.close(fd)


def _wait_readable(in_fd: int, sides: list) -> None:
    """Until events arrive, feed the side outputs whenever they can take more."""
    import select       # only with side outputs (--events-to, --syslog)
    while True:
        waiting = [side for side in sides if side.wants_write()]
        if not waiting:
            return
        try:
            readable, writable, _ = select.select([in_fd], [side.fd for side in waiting], [])
        except InterruptedError:
            continue
        for side in waiting:
            if side.fd in writable:
                side.pump()
        if readable:
            return

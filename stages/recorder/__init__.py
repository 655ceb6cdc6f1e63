"""The recorder: events in (JSON Lines on a pipe), the run file and human lines out.

Forked by the orchestrator, which calls `main_from_fds`; `python -m
stages.recorder` runs it alone (replaying a run file reproduces its human
lines). Imports stay light: this runs in a fork of the orchestrator, and the
tee's `subprocess` is loaded only when asked for.
"""
from __future__ import annotations

import os

from ..record import RecordError, parse_line
from .human import HUMAN_MODES, QUIET, HumanState, format_event

# A line longer than this with no newline is not an event; drop it rather
# than let a broken writer grow our buffer without end.
_MAX_PENDING = 1 << 20


def _say(text: str) -> None:
    try:
        os.write(2, f"vpnw: {text}\n".encode("utf-8", "replace"))
    except OSError:
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _open_record(record: str) -> int:
    if record == "-":
        return os.dup(1)
    parent = os.path.dirname(os.path.abspath(record))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    # Private by default: the record names every host the program talked to.
    return os.open(record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)


class _Tee:
    """The same lines to a command's stdin (`--events-to 'jq -c .'`)."""

    def __init__(self, command: str):
        import signal
        import subprocess
        # A dead reader must give EPIPE here, not kill the recorder.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self._subprocess = subprocess
        self.proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE,
                                     stdout=None, stderr=None, close_fds=True)
        self.fd = self.proc.stdin.fileno()
        self.command = command
        self.alive = True

    def write(self, data: bytes) -> None:
        if not self.alive:
            return
        try:
            _write_all(self.fd, data)
        except OSError as exc:
            self.alive = False
            _say(f"--events-to command {self.command!r} stopped reading ({exc.strerror or exc}); "
                 "the run is still recorded to its file")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except self._subprocess.TimeoutExpired:
            # It had its end of stream; a command that will not finish is ours to stop.
            self.proc.kill()
            self.proc.wait()


def main_from_fds(in_fd: int, *, record: str | None, human: str = "trace",
                  tee_command: str | None = None, color: bool | None = None) -> int:
    """Record events from `in_fd` until end of stream. Returns an exit code:
    0, or 1 when the record file could not be opened or written."""
    if human not in HUMAN_MODES:
        raise ValueError(f"human must be one of {HUMAN_MODES}, not {human!r}")
    if color is None:
        color = "NO_COLOR" not in os.environ and os.isatty(2)
    state = HumanState(mode=human, color=color, record=record)
    status = 0

    record_fd = None
    if record is not None:
        try:
            record_fd = _open_record(record)
        except OSError as exc:
            _say(f"cannot write the record {record}: {exc.strerror or exc}")
            status = 1
    tee = None
    if tee_command:
        try:
            tee = _Tee(tee_command)
        except OSError as exc:
            _say(f"cannot start --events-to command {tee_command!r}: {exc.strerror or exc}")

    bad_lines = 0
    pending = b""
    try:
        while True:
            chunk = os.read(in_fd, 65536)
            if not chunk:
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
                        bad_lines += 1
                    continue
                *lines, pending = pending.split(b"\n")
            for raw in lines:
                if not raw.strip():
                    continue
                try:
                    event = parse_line(raw)
                except RecordError as exc:
                    bad_lines += 1
                    if bad_lines == 1:
                        _say(f"skipping a line that is not a version-1 event ({exc})")
                    continue
                line = raw + b"\n"
                # One write per line: a run killed at any moment leaves whole lines.
                if record_fd is not None:
                    try:
                        _write_all(record_fd, line)
                    except OSError as exc:
                        _say(f"cannot write the record {record}: {exc.strerror or exc}; "
                             "the rest of this run is not recorded")
                        os.close(record_fd)
                        record_fd = None
                        status = 1
                if tee is not None:
                    tee.write(line)
                if human != QUIET:
                    text = format_event(event, state)
                    if text is not None:
                        try:
                            _write_all(2, (text + "\n").encode("utf-8", "replace"))
                        except OSError:
                            pass
    finally:
        if record_fd is not None:
            os.close(record_fd)
        if tee is not None:
            tee.close()
    if bad_lines > 1:
        _say(f"{bad_lines} lines were not version-1 events and were not recorded")
    return status

"""The user's own terminal while vpnw relays the program's (terminal.py):
its mode, its size, and what vpnw draws on it.

`UserTerminal` is the terminal itself: its mode saved once, raw while the
program has the keys and put back exactly, whether vpnw is in the
foreground, vpnw's writes to it. `TerminalScreen` is what goes onto it: the
program's output through the filters vpnw applies, vpnw's own lines merged
in at line boundaries (the pure `line_merger.LineMerger` decides where),
vpnw's control sequences where they land whole, and at the end the modes a
program may leave set put back (docs/security.md, "The person's channel").
"""
from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import termios
import time

from stages.orchestrator.escapes import ClipboardFilter, mid_escape
from stages.orchestrator.line_merger import READABLE, LineMerger

# How long vpnw's lines wait for the program to finish a half-written line.
HOLD_SECONDS = 0.5

# The modes a program may leave set on the user's terminal, put back once it
# has ended and before vpnw's last lines (docs/security.md, "The person's
# channel"): CAN ends an escape sequence the program left unfinished, so
# these are not read as part of it; then all attributes off and the ASCII
# character set (READABLE), insert mode off (IRM), autowrap on (DECAWM),
# normal cursor keys (DECCKM) and keypad (DECKPNM), the cursor shown, the
# scroll region the whole screen (DECSTBM homes the cursor: saved and
# restored around it; origin mode is left, as resetting it homes the cursor
# too and DECRC brings it back), mouse reporting and bracketed
# paste off (a shell turns the latter on again at its prompt), and the
# colours the terminal was configured with (OSC 104 the palette, 110 and 111
# the default foreground and background: a program that made them alike
# would hide every plain line).
MODES_BACK = (b"\x18" + READABLE + b"\x1b[4l\x1b[?7h\x1b[?1l\x1b>\x1b[?25h"
              b"\x1b7\x1b[r\x1b8\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1005l\x1b[?1006l"
              b"\x1b[?1015l\x1b[?2004l\x1b]104\x07\x1b]110\x07\x1b]111\x07")


def _raw(mode: list) -> list:
    """cfmakeraw(3) on a copy of a tcgetattr() list."""
    iflag, oflag, cflag, lflag, ispeed, ospeed, cc = mode
    iflag &= ~(termios.IGNBRK | termios.BRKINT | termios.PARMRK | termios.ISTRIP
               | termios.INLCR | termios.IGNCR | termios.ICRNL | termios.IXON)
    oflag &= ~termios.OPOST
    lflag &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG | termios.IEXTEN)
    cflag &= ~(termios.CSIZE | termios.PARENB)
    cflag |= termios.CS8
    cc = list(cc)
    cc[termios.VMIN] = 1
    cc[termios.VTIME] = 0
    return [iflag, oflag, cflag, lflag, ispeed, ospeed, cc]


def _winsize(fd: int) -> bytes | None:
    try:
        return fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
    except OSError:
        return None


def _columns_rows(winsize: bytes | None) -> tuple[int, int]:
    if not winsize:
        return 80, 24
    rows, cols, _x, _y = struct.unpack("HHHH", winsize)
    return cols or 80, rows or 24


class UserTerminal:
    """The user's own terminal: its mode (saved once, raw while the program
    has the keys, put back exactly), whether vpnw is in the foreground, its
    size, and vpnw's writes to it."""

    def __init__(self, fd_in: int, fd_out: int):
        self.fd_in = fd_in
        self.fd_out = fd_out
        self.saved = termios.tcgetattr(fd_in)
        self.raw = False
        self.output_gone = False     # the user's terminal went away: output is dropped

    def foreground(self) -> bool:
        try:
            return os.tcgetpgrp(self.fd_in) == os.getpgrp()
        except OSError:
            return False

    def enter_raw(self) -> None:
        if self.raw or not self.foreground():
            return
        try:
            termios.tcsetattr(self.fd_in, termios.TCSADRAIN, _raw(self.saved))
        except termios.error:
            return
        self.raw = True

    def restore(self) -> None:
        """The user's terminal exactly as it was. SIGTTOU is blocked meanwhile, so
        a vpnw moved to the background cannot be stopped half way."""
        if not self.raw:
            return
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            termios.tcsetattr(self.fd_in, termios.TCSADRAIN, self.saved)
        except termios.error:
            pass
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.raw = False

    def size(self) -> bytes | None:
        return _winsize(self.fd_out) or _winsize(self.fd_in)

    def write(self, data: bytes) -> None:
        if not data or self.output_gone:
            return
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd_out, view):]
            except InterruptedError:
                continue
            except BlockingIOError:
                select.select([], [self.fd_out], [])
            except OSError:
                self.output_gone = True
                return


class TerminalScreen:
    """What vpnw draws on the user's terminal while it relays: the program's
    output (through --no-clipboard's filter and guard --ask's), vpnw's own
    lines at line boundaries, vpnw's control sequences, the modes put back."""

    def __init__(self, user: UserTerminal, no_clipboard: bool = False):
        self.user = user
        # --no-clipboard: OSC 52 never reaches the user's terminal (docs/security.md).
        self.clipboard_filter = ClipboardFilter() if no_clipboard else None
        self.title_report_filter = None  # guard --ask (asker.py): TitleReportFilter
        self.tail = b""              # the program's last output bytes (see write_control)
        columns, rows = _columns_rows(_winsize(user.fd_out))
        self.merger = LineMerger(hold=HOLD_SECONDS, newline=b"\r\n", columns=columns, rows=rows,
                                 line_start=READABLE)
        self.modes_back = False      # MODES_BACK written (or no program ever had the terminal)

    def resize(self, size: bytes) -> None:
        self.merger.columns, self.merger.rows = _columns_rows(size)

    def program_output(self, data: bytes, now: float) -> None:
        if self.clipboard_filter is not None:
            data = self.clipboard_filter.feed(data)
        if self.title_report_filter is not None:
            data = self.title_report_filter.feed(data)
        self.tail = (self.tail + data[-256:])[-256:]
        self.user.write(self.merger.program_output(data, now))

    def human_line(self, line: bytes, now: float) -> None:
        self.user.write(self.merger.human_line(line, now))

    def say(self, text: str) -> None:
        """One of vpnw's own lines (the orchestrator's messages)."""
        self.human_line(text.encode("utf-8", "replace"), time.monotonic())

    def write_control(self, data: bytes, force: bool = False) -> bool:
        """Control sequences of vpnw's own (a title, a bell) that draw
        nothing on the screen: written now unless the program's output
        stops inside an escape sequence, where they would land in it (then
        False: try again later)."""
        if not force and mid_escape(self.tail):
            return False
        self.user.write(data)
        return True

    def tick(self) -> None:
        self.user.write(self.merger.tick(time.monotonic()))

    def flush_held(self) -> None:
        """vpnw's lines held for a half-written line, out now (vpnw stops)."""
        self.user.write(self.merger.finish() if self.merger.held else b"")

    def program_ended(self, had_terminal: bool) -> None:
        self.user.write(self.merger.program_ended())
        self.put_modes_back(had_terminal)

    def _flush_clipboard_filter(self) -> None:
        if self.clipboard_filter is not None:
            self.user.write(self.merger.program_output(self.clipboard_filter.finish(),
                                                       time.monotonic()))
            self.clipboard_filter = None

    def put_modes_back(self, had_terminal: bool) -> None:
        """MODES_BACK once, when a program had the terminal."""
        if self.modes_back or not had_terminal:
            return
        self.modes_back = True
        self._flush_clipboard_filter()
        self.user.write(MODES_BACK)

    def finish(self, rest: bytes, had_terminal: bool) -> None:
        """Every ending's last writes: the filter's held bytes, the modes put
        back, vpnw's last half line, what the merger still holds, and the
        readable character set for what the person types next."""
        self._flush_clipboard_filter()
        self.put_modes_back(had_terminal)
        if rest:
            self.human_line(rest, time.monotonic())
        self.user.write(self.merger.finish())
        if had_terminal:
            self.user.write(READABLE)    # what the person types next is seen

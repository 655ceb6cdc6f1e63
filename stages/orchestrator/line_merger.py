"""vpnw's own lines joined to the program's terminal output, never inside one of its lines.

Pure (no I/O, no clock): the relay feeds it the program's output chunks and
vpnw's human lines with the current time, and writes out what it returns.

What the user sees:
- The program's bytes pass at once and unchanged.
- When the program's output stands at a line boundary (nothing written yet,
  or its last byte was a newline), vpnw's lines go out at once.
- When the program is in the middle of a line (a prompt, a progress bar),
  vpnw's lines wait for its newline, at most `hold` seconds. After that they
  go out on lines of their own: the half line is erased (all the rows it
  wrapped over), vpnw's lines are written, and the half line is written
  again, so a prompt such as "Passphrase: " reappears below them, whole,
  with the cursor where the program left it, and a long line being written
  in pieces is never seen cut. A line editor's half line (bash's readline:
  a coloured prompt, bracketed paste, the half-typed input edited in place)
  is drawn again as the terminal shows it (half_line.py), cursor included.
  A half line that cannot be redrawn safely (cursor up, absolute positions,
  tabs, wider than the screen) is left as it is and vpnw's lines start on
  the next line.
- While the program uses the alternate screen (full-screen programs: less,
  vim, most agent interfaces), a line written there would be painted over
  or corrupt the picture; vpnw's lines wait until it leaves the alternate
  screen or the run ends. At most `max_held` lines wait; beyond that the
  oldest are dropped and counted (every line is in the record anyway).
  A program that ends there (killed) gets the user's screen given back.
- Each of vpnw's lines starts with `line_start` (the relay gives
  `READABLE`): whatever attributes the program left set (SGR 8 "conceal",
  colours that match the background, a line-drawing character set), vpnw's
  own line is drawn plainly. The program's next line sets its own again.
"""
from __future__ import annotations

import unicodedata
from collections import deque

from stages.orchestrator.escapes import ScreenModes
from stages.orchestrator.half_line import rebuild

# Leave the alternate screen, show the cursor, mouse reporting (every mode and
# encoding) and bracketed paste off.
_GIVE_BACK = (b"\x1b[?1049l\x1b[?25h\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1005l"
              b"\x1b[?1006l\x1b[?1015l\x1b[?2004l")

# What makes one of vpnw's lines readable whatever the program left set:
# all attributes off (SGR 0: no conceal, no colours), G0 selected (SI) and
# G0 the ASCII set (ESC ( B), not a line-drawing one.
READABLE = b"\x1b[0m\x0f\x1b(B"

# A half line longer than this is never replayed (nor kept).
_MAX_PARTIAL = 4096


class LineMerger:
    """Decides where vpnw's human lines go into the program's output stream.

    `newline` is what ends one of vpnw's lines on the user's terminal:
    b"\\r\\n" while that terminal is in raw mode (no output processing),
    b"\\n" otherwise.
    """

    def __init__(self, *, hold: float = 0.5, max_held: int = 1000,
                 newline: bytes = b"\r\n", columns: int = 80, rows: int = 24,
                 line_start: bytes = b""):
        self.line_start = line_start
        self.hold = hold
        self.max_held = max_held
        self.newline = newline
        self.columns = columns
        self.rows = rows
        self.held: deque[bytes] = deque()
        self.dropped = 0
        self.at_boundary = True      # the program's last byte was a newline (or none yet)
        self.partial = b""           # the program's bytes since its last newline (capped)
        self.partial_overflow = False
        self.alternate = False       # the program is on the alternate screen
        self._screen = ScreenModes()  # follows the alternate screen across chunks
        self._waiting_since: float | None = None

    # ---- input

    def program_output(self, data: bytes, now: float) -> bytes:
        """The program wrote `data`: returns what to write (its bytes, maybe followed by ours)."""
        if not data:
            return b""
        self._track_screen(data)
        last_newline = data.rfind(b"\n")
        if last_newline >= 0:
            rest = data[last_newline + 1:]
            self.partial, self.partial_overflow = rest[:_MAX_PARTIAL], len(rest) > _MAX_PARTIAL
        elif not self.partial_overflow:
            self.partial += data
            if len(self.partial) > _MAX_PARTIAL:
                self.partial, self.partial_overflow = b"", True
        self.at_boundary = data.endswith(b"\n")
        if self.at_boundary:
            self._waiting_since = None
        return data + self._release(now)

    def human_line(self, line: bytes, now: float) -> bytes:
        """vpnw has a line to show (without its newline): returns what to write now."""
        line = line.rstrip(b"\r\n")
        self.held.append(line)
        while len(self.held) > self.max_held:
            self.held.popleft()
            self.dropped += 1
        if self._waiting_since is None:
            self._waiting_since = now
        return self._release(now)

    def tick(self, now: float) -> bytes:
        """Time passed: returns what the end of a hold lets out."""
        return self._release(now)

    def deadline(self) -> float | None:
        """When to call tick() next (None: nothing is waiting on time)."""
        if not self.held or self.alternate or self.at_boundary or self._waiting_since is None:
            return None
        return self._waiting_since + self.hold

    def program_ended(self) -> bytes:
        """The program is gone: if it left the screen its own (killed inside
        the alternate screen), what gives the user's back, as tmux and screen
        do; vpnw's lines then go out below what was there before."""
        if not self.alternate:
            return b""
        self.alternate = self._screen.alternate = False
        self.at_boundary, self.partial, self.partial_overflow = True, b"", False
        return _GIVE_BACK + (self._lines() if self.held or self.dropped else b"")

    def finish(self) -> bytes:
        """The program's output is over: everything still held, on lines of its own."""
        if not self.held and not self.dropped:
            return b""
        out = b"" if self.at_boundary else self.newline
        self.at_boundary = True
        self.alternate = False
        return out + self._lines()

    # ---- internals

    def _track_screen(self, data: bytes) -> None:
        self.alternate = self._screen.feed(data)

    def _lines(self) -> bytes:
        lines = list(self.held)
        self.held.clear()
        if self.dropped:
            lines.append(f"vpnw: {self.dropped} of vpnw's lines were not shown while the program "
                         f"held the screen; the record has every event".encode())
            self.dropped = 0
        self._waiting_since = None
        return b"".join(self.line_start + line + self.newline for line in lines)

    def _release(self, now: float) -> bytes:
        if not self.held or self.alternate:
            return b""
        if self.at_boundary:
            return self._lines()
        if self._waiting_since is None or now < self._waiting_since + self.hold:
            return b""
        # The program has sat mid-line for the whole hold: lines of our own.
        redraw = self._redraw_partial()
        if redraw is not None:
            erase, picture = redraw
            return erase + self._lines() + picture
        self.at_boundary = True
        self.partial = b""
        return self.newline + self._lines()

    def _redraw_partial(self) -> tuple[bytes, bytes] | None:
        """What erases the half line from the screen (it started at column 0,
        after a newline) and what draws it again, or None when that cannot be
        done safely."""
        if self.partial_overflow or not self.partial or self.columns <= 0:
            return None
        width = display_width(self.partial)
        if width is None:
            line = rebuild(self.partial, self.columns)      # one row, edited in place
            return None if line is None else (b"\r\x1b[J", line.redraw)
        if width > self.columns * max(self.rows - 1, 1):
            return None
        up = (width - 1) // self.columns if width else 0
        return (b"\x1b[%dA" % up if up else b"") + b"\r\x1b[J", self.partial


def display_width(text: bytes) -> int | None:
    """Columns `text` takes on a terminal, or None unless it is plain printable
    UTF-8 (no control characters, escape sequences, tabs or invalid bytes),
    whose width alone decides where the cursor is."""
    try:
        chars = text.decode("utf-8")
    except UnicodeDecodeError:
        return None
    width = 0
    for char in chars:
        category = unicodedata.category(char)
        if category[0] == "C":
            return None
        if category in ("Mn", "Me"):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width

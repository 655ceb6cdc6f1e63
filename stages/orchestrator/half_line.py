"""The line a program's cursor stands on, rebuilt from what the program wrote
since its last newline: what the terminal shows there and where the cursor is.

Pure. The line merger (line_merger.py) uses it to draw a line editor's prompt
and the half-typed input again below vpnw's lines. bash's readline, for one,
turns bracketed paste on before its prompt, colours it, and edits the line
with backspaces, erases and insertions: the bytes are not the picture, so
they cannot simply be written again. What is understood is what draws on one
line and moves the cursor along it (text, \\r, \\b, CSI C D G K P X @), and
what draws nothing (colours, private modes such as bracketed paste, window
titles); anything else (cursor up, absolute positions, insert mode, a line
as wide as the screen) gives None, and the merger then leaves the line as it
is and puts vpnw's lines below it.
"""
from __future__ import annotations

import re
import unicodedata
from typing import NamedTuple

_CSI = re.compile(r"\x1b\[([0-9;?]*)([\x20-\x2f]*)([\x40-\x7e])")
_OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_BLANK = ("", " ")
# Private modes that change nothing on the screen: cursor keys, autowrap,
# blinking and shown cursor, meta keys, mouse reporting, bracketed paste. The
# alternate screen (1049, 47) and the rest are not among them.
_QUIET_MODES = {1, 7, 12, 25, 1000, 1002, 1003, 1004, 1005, 1006, 1015, 1034, 1036, 2004}


class HalfLine(NamedTuple):
    redraw: bytes   # written at column 0 of an empty line: the same picture, cursor included
    width: int      # columns the line takes
    cursor: int     # the cursor's column


def rebuild(data: bytes, columns: int) -> HalfLine | None:
    """The line `data` draws from column 0, or None when it does more than one line can show."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    line = _HalfLine()
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\x1b":
            found = _CSI.match(text, i) or _OSC.match(text, i)
            if found is None or (found.re is _CSI and not line.control(*found.groups())):
                return None
            i = found.end()
        elif line.character(char):
            i += 1
        else:
            return None
        if line.cursor >= columns or len(line.cells) >= columns:
            return None                                   # wrapped: more than one row
    return line.picture()


class _HalfLine:
    """Cells of one terminal line: (the colour sequences in force, the
    character); the right half of a wide character is an empty character."""

    def __init__(self) -> None:
        self.cells: list[tuple[str, str]] = []
        self.cursor = 0
        self.colour = ""

    def character(self, char: str) -> bool:
        if char == "\r":
            self.cursor = 0
        elif char == "\b":
            self.cursor = max(self.cursor - 1, 0)
        elif char == "\x07":
            pass                                          # the bell draws nothing
        else:
            category = unicodedata.category(char)
            if category[0] == "C":
                return False                              # tab, other controls: not followed
            if category in ("Mn", "Me"):
                if self.cursor == 0 or self.cursor > len(self.cells):
                    return False
                colour, base = self.cells[self.cursor - 1]
                self.cells[self.cursor - 1] = (colour, base + char)
                return True
            wide = unicodedata.east_asian_width(char) in ("W", "F")
            self._put((self.colour, char))
            if wide:
                self._put((self.colour, ""))
        return True

    def _put(self, cell: tuple[str, str]) -> None:
        self._pad(self.cursor + 1)
        self._split_wide(self.cursor)
        self.cells[self.cursor] = cell
        self.cursor += 1

    def _pad(self, length: int) -> None:
        self.cells += [_BLANK] * (length - len(self.cells))

    def _split_wide(self, at: int) -> None:
        """Writing over half of a wide character blanks its other half, as a terminal does."""
        if self.cells[at][1] == "" and at > 0:
            self.cells[at - 1] = _BLANK
        if at + 1 < len(self.cells) and self.cells[at + 1][1] == "":
            self.cells[at + 1] = _BLANK

    def control(self, params: str, intermediate: str, final: str) -> bool:
        """A CSI sequence; False when it does what one line cannot show."""
        if params.startswith("?"):
            modes = params[1:].split(";")
            return (final in "hl" and not intermediate
                    and all(m.isdigit() and int(m) in _QUIET_MODES for m in modes))
        if intermediate or not re.fullmatch(r"[0-9;]*", params):
            return False
        numbers = [int(p) if p else 0 for p in params.split(";")]
        n = max(numbers[0], 1)
        if final == "m":
            self.colour = "" if numbers in ([0], []) else self.colour + f"\x1b[{params}m"
        elif final == "C":
            self.cursor += n
        elif final == "D":
            self.cursor = max(self.cursor - n, 0)
        elif final == "G":
            self.cursor = n - 1
        elif final == "K":
            return self._erase(numbers[0])
        elif final == "P":
            del self.cells[self.cursor:self.cursor + n]
        elif final == "X":
            self._pad(self.cursor + n)
            self.cells[self.cursor:self.cursor + n] = [_BLANK] * n
        elif final == "@":
            self._pad(self.cursor)
            self.cells[self.cursor:self.cursor] = [_BLANK] * n
        else:
            return False
        return True

    def _erase(self, how: int) -> bool:
        if how == 0:
            del self.cells[self.cursor:]
        elif how in (1, 2):
            end = len(self.cells) if how == 2 else min(self.cursor + 1, len(self.cells))
            self.cells[:end] = [_BLANK] * end
        else:
            return False
        return True

    def picture(self) -> HalfLine:
        cells = self.cells
        while cells and cells[-1] == _BLANK:
            cells = cells[:-1]
        out, colour = [], ""
        for cell_colour, char in cells:
            if cell_colour != colour:
                out.append("\x1b[0m" + cell_colour)
                colour = cell_colour
            out.append(char)
        if self.colour != colour:
            out.append("\x1b[0m" + self.colour)
        width = len(cells)
        if self.cursor < width:
            out.append(f"\x1b[{width - self.cursor}D")
        elif self.cursor > width:
            out.append(f"\x1b[{self.cursor - width}C")
        return HalfLine("".join(out).encode("utf-8"), width, self.cursor)

"""Escape sequences in the program's terminal output that vpnw must follow.
Pure (bytes in, state or bytes out), fed chunk by chunk, so a sequence split
across reads is seen whole.

- `ScreenModes` follows the alternate screen (DECSET/DECRST 47, 1047, 1049)
  the way a VT500-style parser reads them: any position in a parameter list
  (`ESC[?1;1049h`), leading zeros, sub-parameters, C0 controls inside the
  sequence (a terminal executes them and goes on), CAN/SUB/ESC aborting it,
  and XTSAVE/XTRESTORE (`CSI ? Pm s` / `r`) of those modes. Where terminals
  differ it leans to "alternate": vpnw's lines then wait (they are never
  lost), whereas a missed switch would paint them into a screen that is
  thrown away.
- `ClipboardFilter` removes OSC 52 (`ESC ] 52 ; Pc ; Pd BEL|ST`, set or
  query the clipboard) for `--no-clipboard`, holding only the few bytes that
  may still turn out to start one.
- `mid_escape` says whether the output seen so far stops inside a sequence,
  where a control sequence of vpnw's own (a title, a bell) must not be
  written yet.

Only the 7-bit forms: a terminal in UTF-8 mode reads 0x9b/0x9d as parts of
characters, not as CSI/OSC.
"""
from __future__ import annotations

ESC, BEL, CAN, SUB = 0x1B, 0x07, 0x18, 0x1A
_SCREEN_MODES = frozenset((47, 1047, 1049))
_MAX_PARAM = 1 << 20          # a terminal clamps a huge number; it is no mode of ours then

_GROUND, _ESCAPE, _CSI, _CSI_IGNORE, _STRING = range(5)


class ScreenModes:
    """Whether the program's terminal shows the alternate screen."""

    def __init__(self):
        self.alternate = False
        self._state = _GROUND
        self._private = b""
        self._params: list[int] = []
        self._value = 0
        self._sub = False             # after ':' in this parameter: not the mode number
        self._intermediate = False
        self._saved: dict[int, bool] = {}

    def feed(self, data: bytes) -> bool:
        """The program wrote `data`; returns whether it is on the alternate screen."""
        i, n = 0, len(data)
        while i < n:
            if self._state == _GROUND:
                i = data.find(b"\x1b", i)
                if i < 0:
                    break
                self._state = _ESCAPE
            else:
                self._byte(data[i])
            i += 1
        return self.alternate

    def _byte(self, b: int) -> None:
        if b == ESC:
            self._state = _ESCAPE
        elif b in (CAN, SUB):
            self._state = _GROUND
        elif self._state == _ESCAPE:
            self._escape(b)
        elif self._state == _STRING:
            pass                      # OSC/DCS/SOS/PM/APC body: ends at ESC, BEL, CAN or SUB
        elif b < 0x20 or b == 0x7F or b >= 0x80:
            return                    # executed or ignored by the terminal, inside the sequence
        elif self._state == _CSI:
            self._csi(b)
        elif 0x40 <= b <= 0x7E:       # _CSI_IGNORE: its final byte ends it
            self._state = _GROUND

    def _escape(self, b: int) -> None:
        if b == ord("["):
            self._state = _CSI
            self._private, self._params, self._value = b"", [], 0
            self._sub = self._intermediate = False
        elif b in b"]PX^_":
            self._state = _STRING
        elif 0x30 <= b <= 0x7E:
            self._state = _GROUND
        # intermediates (0x20-0x2f) and C0 controls: still in the escape

    def _csi(self, b: int) -> None:
        if 0x30 <= b <= 0x39:
            if self._intermediate:
                self._state = _CSI_IGNORE
            elif not self._sub:
                self._value = min(self._value * 10 + b - 0x30, _MAX_PARAM)
        elif b in (0x3A, 0x3B):
            if self._intermediate:
                self._state = _CSI_IGNORE
            elif b == 0x3B:
                self._params.append(self._value)
                self._value, self._sub = 0, False
            else:
                self._sub = True
        elif 0x3C <= b <= 0x3F:
            if self._params or self._value or self._sub or self._private or self._intermediate:
                self._state = _CSI_IGNORE
            else:
                self._private = bytes((b,))
        elif 0x20 <= b <= 0x2F:
            self._intermediate = True
        else:
            self._params.append(self._value)
            self._dispatch(b)
            self._state = _GROUND

    def _dispatch(self, final: int) -> None:
        if self._private != b"?" or self._intermediate:
            return
        modes = _SCREEN_MODES.intersection(self._params)
        if not modes:
            return
        if final in b"hl":
            self.alternate = final == ord("h")
        elif final == ord("s"):
            for mode in modes:
                self._saved[mode] = self.alternate
        elif final == ord("r"):
            restored = [self._saved[m] for m in modes if m in self._saved]
            if restored:
                self.alternate = any(restored)


_OSC_NUMBER = 16              # digits of an OSC number worth reading before giving up


class ClipboardFilter:
    """The program's output without OSC 52."""

    def __init__(self):
        self._held = b""              # bytes that may start an OSC 52
        self._dropping = False        # inside an OSC 52
        self._drop_esc = False        # an ESC inside it: ST, or the start of something new

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        i, n = 0, len(data)
        while i < n:
            if self._dropping:
                i = self._drop(data, i)
            elif self._held:
                i = self._prefix(data, i, out)
            else:
                j = data.find(b"\x1b", i)
                if j < 0:
                    out += data[i:]
                    break
                out += data[i:j]
                self._held = b"\x1b"
                i = j + 1
        return bytes(out)

    def finish(self) -> bytes:
        """The end of the output: what was held was no OSC 52 after all."""
        held, self._held = self._held, b""
        return held

    def _drop(self, data: bytes, i: int) -> int:
        b = data[i]
        if self._drop_esc:
            self._dropping = self._drop_esc = False
            if b == ord("\\"):
                return i + 1          # ST: the end of it
            self._held = b"\x1b"      # an ESC that starts something else
            return i
        if b == ESC:
            self._drop_esc = True
        elif b in (BEL, CAN, SUB):
            self._dropping = False
        return i + 1

    def _prefix(self, data: bytes, i: int, out: bytearray) -> int:
        b = data[i]
        held = self._held
        in_osc = held.startswith(b"\x1b]")
        if b < 0x20 and b not in (ESC, CAN, SUB) and not (in_osc and b == BEL):
            # A terminal executes a C0 control inside a sequence and goes on
            # with the sequence: it goes out now, the sequence stays held.
            out.append(b)
            return i + 1
        if not in_osc and b == ord("]"):
            self._held = b"\x1b]"
            return i + 1
        if in_osc and 0x30 <= b <= 0x39 and len(held) < 2 + _OSC_NUMBER:
            self._held = held + bytes((b,))
            return i + 1
        if in_osc and b == 0x3B and len(held) > 2 and int(held[2:]) == 52:
            self._held = b""
            self._dropping = True
            return i + 1
        out += held
        self._held = b""
        return i                      # this byte, read again as ordinary output


_MAX_CSI = 64                 # a longer CSI is no title report: let it pass


class TitleReportFilter:
    """The program's output without the requests that make the terminal
    report its title (XTWINOPS `CSI 21 t`, and the icon label, `CSI 20 t`).
    The terminal answers them as if typed, and vpnw relays what is typed to
    the program: under `guard --ask` the title holds the open question's
    code, which the program must never read (docs/security.md, "The
    person's channel"). Holds only the bytes of a CSI not yet ended."""

    def __init__(self):
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        i, n = 0, len(data)
        while i < n:
            if not self._held:
                j = data.find(b"\x1b", i)
                if j < 0:
                    out += data[i:]
                    break
                out += data[i:j]
                self._held = b"\x1b"
                i = j + 1
                continue
            b = data[i]
            held = self._held
            if len(held) == 1:
                if b == ord("["):
                    self._held = b"\x1b["
                    i += 1
                else:
                    out += held
                    self._held = b""
                continue
            if b < 0x20 and b not in (ESC, CAN, SUB):
                out.append(b)             # executed inside the sequence; it goes on
                i += 1
                continue
            if 0x20 <= b <= 0x3F and len(held) < _MAX_CSI:
                self._held = held + bytes((b,))
                i += 1
                continue
            if 0x40 <= b <= 0x7E:
                whole = held + bytes((b,))
                self._held = b""
                i += 1
                if not _title_report(whole):
                    out += whole
                continue
            out += held                   # aborted or too long: not ours to judge
            self._held = b""
        return bytes(out)

    def finish(self) -> bytes:
        held, self._held = self._held, b""
        return held


def _title_report(csi: bytes) -> bool:
    """Whether a whole `ESC [ ... final` asks for the title or icon label."""
    if csi[-1:] != b"t":
        return False
    params = csi[2:-1]
    if not params or not params[:1].isdigit():
        return False
    first = params.split(b";")[0]
    return first.isdigit() and int(first) in (20, 21)


_OSC_END = (b"\x07", b"\x1b\\")


def mid_escape(tail: bytes) -> bool:
    """Whether the program's output stops inside an escape sequence (so
    bytes of ours written now would land inside it). `tail`: its last bytes."""
    esc = tail.rfind(b"\x1b")
    if esc < 0:
        return False
    rest = tail[esc + 1:]
    if not rest:
        return True
    if rest[:1] == b"]":                      # OSC: ends with BEL or ESC \
        return not any(end in rest for end in _OSC_END)
    if rest[:1] == b"[":                      # CSI: ends with a byte 0x40-0x7e
        return not any(0x40 <= b <= 0x7E for b in rest[1:])
    if rest[:1] == b"\\":                     # the ST of an earlier OSC
        return False
    return len(rest) < 1

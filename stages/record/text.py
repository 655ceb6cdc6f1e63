"""Text for people, shared by every stage that writes it: what may reach a
terminal, and how amounts read.

Host names come from the sandboxed program; a name carrying terminal escape
sequences must not reach the user's terminal, whether in a human line, a
summary table or a draft policy's comments.
"""
from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, and the Unicode line/paragraph separators and
# bidi overrides that could reorder what the user sees.
_UNPRINTABLE = "[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
_unprintable = None


def printable(value) -> str:
    text = str(value)
    if text.isascii() and text.isprintable():
        return text     # none of _UNPRINTABLE; the pattern is compiled only when needed
    global _unprintable     # (~1 ms of CPU, on the recorder's way to run.start when at import)
    if _unprintable is None:
        _unprintable = re.compile(_UNPRINTABLE)
    return _unprintable.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                            else f"\\u{ord(m.group()):04x}", text)


def human_bytes(n) -> str:
    """Decimal units, as network tools count: 999 B, 1.2 kB, 3.4 MB."""
    if not isinstance(n, (int, float)) or isinstance(n, bool):
        return "?"
    if n < 1000:
        return f"{int(n)} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000
        if n < 999.95 or unit == "TB":
            return f"{n:.1f} {unit}"
    return "?"  # unreachable

"""The text of /proc/self/mountinfo: pure, no imports, so that both the
helper's mounts (kernel/mounts.py) and the orchestrator's work set
(config/work_set.py) read it without loading the kernel calls."""
from __future__ import annotations


def unescape(field: str) -> str:
    """A mountinfo field with the kernel's octal escapes (a backslash and three
    octal digits: `\\040` for a space) undone; without `re`, which nothing
    else on the helper's way to Ready imports."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        digits = field[i + 1:i + 4]
        if field[i] == "\\" and len(digits) == 3 and all(d in "01234567" for d in digits):
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)

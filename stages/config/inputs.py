"""Reading a file the user names (`--policy`, `--config`): one place, one
error style.

Whatever is wrong with the input itself (missing, a directory, unreadable,
endless like /dev/zero, not UTF-8, a byte order mark) becomes an
`InputProblem(problem, fix)`; the caller puts the file's name in front, so
every message reads `file: problem; fix: ...` and exits 121. `-` reads stdin,
as `vpnw learn --from -` does.
"""
from __future__ import annotations

import errno
import os
import stat
import sys

MAX_INPUT = 1 << 20      # 1 MiB: a policy of 10,000 rules is ~300 KB
STDIN = "-"
_BOM = b"\xef\xbb\xbf"


class InputProblem(Exception):
    def __init__(self, problem: str, fix: str, line: int | None = None):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
        self.line = line


_OPEN_PROBLEMS = {
    errno.ENOENT: ("no such file", "check the file name"),
    errno.ENOTDIR: ("no such file (a part of the path is not a directory)", "check the file name"),
    errno.EACCES: ("cannot be read (permission denied)",
                   "make the file readable by the user who runs vpnw"),
    errno.EPERM: ("cannot be read (operation not permitted)",
                  "make the file readable by the user who runs vpnw"),
    errno.ELOOP: ("too many levels of symbolic links", "point at the file itself"),
    errno.ENAMETOOLONG: ("the file name is too long", "check the file name"),
}


def _read_bounded(fd: int, limit: int, what: str) -> bytes:
    chunks, size = [], 0
    while True:
        try:
            chunk = os.read(fd, min(65536, limit + 1 - size))
        except IsADirectoryError:
            raise InputProblem("is a directory", f"name the {what} file itself") from None
        except OSError as exc:
            raise InputProblem(f"cannot be read ({exc.strerror})",
                               f"name a readable {what} file") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise InputProblem(f"is larger than {limit // 1024} KiB (or never ends), which no "
                               f"{what} file is", f"name the {what} file itself")


def _kib(size: int) -> str:
    return f"{size / 1024:.0f} KiB" if size < 10 * 1024 * 1024 else f"{size / 1048576:.0f} MiB"


def read_bytes(name: str, what: str, *, limit: int = MAX_INPUT, stdin=None) -> bytes:
    """The bytes of file `name` ("-": stdin), at most `limit`; InputProblem otherwise."""
    if name == STDIN:
        stream = stdin if stdin is not None else sys.stdin.buffer
        return _read_bounded(stream.fileno(), limit, what)
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not hang vpnw.
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        problem, fix = _OPEN_PROBLEMS.get(exc.errno, (f"cannot be opened ({exc.strerror})",
                                                      "check the file name"))
        raise InputProblem(problem, fix) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InputProblem("is a directory", f"name the {what} file itself")
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            raise InputProblem("is not a regular file", f"name the {what} file itself")
        size = os.fstat(fd).st_size
        if stat.S_ISREG(mode) and size > limit:
            raise InputProblem(f"is too large: {_kib(size)}, and a {what} file may be at most "
                               f"{limit // 1024} KiB", f"make it smaller (or name the {what} file "
                               f"itself, if this is another file)")
        os.set_blocking(fd, True)
        return _read_bounded(fd, limit, what)
    finally:
        os.close(fd)


def decode_text(raw: bytes, what: str) -> str:
    """UTF-8 text, or InputProblem naming the line of the first bad byte."""
    if raw.startswith(_BOM):
        raise InputProblem("starts with a UTF-8 byte order mark (BOM), which TOML does not allow",
                           "save it as UTF-8 without a BOM", line=1)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise InputProblem(f"the {what} is not UTF-8 text", "save it as UTF-8", line=line) from None


def read_text(name: str, what: str, *, limit: int = MAX_INPUT, stdin=None) -> str:
    return decode_text(read_bytes(name, what, limit=limit, stdin=stdin), what)


def source_name(name: str) -> str:
    """How messages and the record name the input."""
    return "<stdin>" if name == STDIN else name

"""The ledger of runs (docs/record.md, "The ledger"): one append-only file in
vpnw's state directory, one line per signed run, chained like a run file.

    {"v":1,"seq":12,"run":"r-36e0ba","file":"/home/me/.local/state/vpnw/runs/r-36e0ba.jsonl",
     "start":"...","end":"...","lines":57,"digest":"<the run's last d>","key":"<key id>",
     "sig":"<the run's .minisig, whole>","d":"<this line's link in the ledger's chain>"}

Appends are safe with runs ending together: the recorder takes an exclusive
flock on the ledger, reads its last line (the next seq and the chain's head),
signs the run with both in the trusted comment, and writes the new line with
one write(2) on an O_APPEND descriptor. Each run's signature so names its
place in the ledger and the ledger's head before it: a line removed or
rewritten in the middle breaks the chain, and lines cut from the end show as
soon as any later-signed run names a place the ledger no longer has.
"""
from __future__ import annotations

import fcntl
import os
import stat

import orjson

from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.record.chain import Chain, link_problem
from stages.record.events import split_digest, vpnw_state_dir
from stages.record.signing import BadSignature, parse_minisig

LEDGER_NAME = "ledger.jsonl"
_TAIL = 16384


def ledger_path() -> str:
    return os.path.join(vpnw_state_dir(), LEDGER_NAME)


class Appender:
    """The ledger held under an exclusive lock: `seq` and `head` are what the
    next line will be and follow; `append` writes it."""

    def __init__(self, fd: int):
        self.fd = fd
        last = _last_line(fd)
        parts = split_digest(last) if last else None
        entry = orjson.loads(last) if parts else {}
        self.seq = int(entry.get("seq", 0)) + 1 if isinstance(entry, dict) else 1
        self.head = parts[1].decode() if parts else ""

    def append(self, entry: dict) -> bytes:
        chain = Chain()
        chain.prev = self.head.encode()
        line = chain.seal(orjson.dumps({"v": 1, "seq": self.seq, **entry})) + b"\n"
        # One write on O_APPEND: whole, after every line another run wrote.
        if os.write(self.fd, line) != len(line):
            raise OSError("the ledger line was written in part")
        return line


class locked:
    """`with locked(path) as book:` the ledger, opened for appending (made
    0600 on first use) and held under flock until the block ends."""

    def __init__(self, path: str):
        self.path = path
        self.fd = -1

    def __enter__(self) -> Appender:
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            return Appender(self.fd)
        except BaseException:
            os.close(self.fd)
            raise

    def __exit__(self, *_exc) -> None:
        os.close(self.fd)     # drops the lock


def _last_line(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    start = max(0, size - _TAIL)
    tail = os.pread(fd, size - start, start)
    lines = [line for line in tail.split(b"\n") if line.strip()]
    return lines[-1] if lines and tail.endswith(b"\n") else b""


# ---------------------------------------------------------------- reading

class Ledger(NamedTuple):
    """The ledger as read: its entries up to the first problem."""
    path: str
    entries: list[dict]          # the lines read, in order, up to the first problem
    problem: str | None          # where its chain breaks or it was cut; None: whole
    exists: bool = True
    unreadable: str | None = None  # why it could not be read (e.g. "Permission denied"): nothing checked

    def by_file(self, path: str) -> dict | None:
        real = os.path.realpath(path)
        found = None
        for entry in self.entries:
            if entry.get("file") in (path, real):
                found = entry     # the last one: a file written again is its newest run
        return found

    def by_run(self, run_id: str) -> dict | None:
        found = None
        for entry in self.entries:
            if entry.get("run") == run_id:
                found = entry
        return found

    def gone_from(self, directory: str) -> list[dict]:
        """Entries for files in `directory` that no longer exist (deleted or
        moved away), the newest entry of each file."""
        here = os.path.realpath(directory)
        gone: dict[str, dict] = {}
        for entry in self.entries:
            file = entry.get("file")
            if isinstance(file, str) and os.path.dirname(file) == here and not os.path.lexists(file):
                gone[file] = entry
        return list(gone.values())

    def unreadable_text(self) -> str:
        """The one line for a ledger that cannot be read (nothing is checked against it)."""
        return (f"cannot read {self.path}: {self.unreadable} (the ledger of runs is the user's "
                f"own file, 0600: read it as the user whose runs it lists, or give it back to them)")

    @property
    def head(self) -> str | None:
        return self.entries[-1].get("d") if self.entries else None


def _entry_problem(entry, n: int, prev: bytes) -> str | None:
    """Line n's own claims against its place: its seq, and the place its
    run's signed trusted comment names (checked cryptographically in
    stages/record/evidence.py)."""
    if not isinstance(entry, dict) or entry.get("seq") != n:
        return (f"line {n} is not entry {n}: lines were removed or added and the chain "
                "computed again")
    try:
        signed = parse_minisig(entry.get("sig") or "").fields()
    except BadSignature:
        return f"line {n} (run {entry.get('run')}) holds no signature"
    if signed.get("ledger") != str(n) or signed.get("prev") != (prev.decode() or "-"):
        return (f"line {n} (run {entry.get('run')}) was signed as entry {signed.get('ledger')} "
                "after another head: lines before it were removed, added or rewritten")
    return None


def read(path: str | None = None) -> Ledger:
    """The ledger checked line by line: its chain, and seq 1, 2, 3..."""
    path = path or ledger_path()
    try:
        # O_NONBLOCK: a FIFO in its place is said, it does not hold the reader.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return Ledger(path, [], None, exists=False)
    except OSError as exc:
        # Another user's (a run under sudo), a loop of links: it says nothing
        # either way, and the reader says so in one line.
        return Ledger(path, [], None, unreadable=exc.strerror or str(exc))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return Ledger(path, [], f"{path}: not a regular file (the ledger was replaced)")
    stream = os.fdopen(fd, "rb")
    entries: list[dict] = []
    prev = b""
    with stream:
        for n, raw in enumerate(stream, 1):
            problem, digest = link_problem(prev, n, raw)
            if problem is None:
                try:
                    entry = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    entry = None
                problem = _entry_problem(entry, n, prev)
            if problem:
                return Ledger(path, entries, f"{path}: {problem}")
            entries.append(entry)
            prev = digest
    return Ledger(path, entries, None)

"""The digest chain of a run file: sealing lines (the recorder) and checking
a file (`vpnw show --verify`). Pure: bytes in, bytes or a verdict out.

The chain is computed by the recorder because it is the one writer of the
run file: the orchestrator and the broker both emit into the event pipe, and
only the order in which the recorder reads the lines is the file's order.
See stages/record/events.py for the definition and docs/record.md for what it
proves and what it does not.
"""
from __future__ import annotations

import orjson

from stages.startup.records import FrozenRecord
from stages.record.digests import sha256
from stages.record.events import split_digest

TYPE_CHECKING = False   # typing for the annotations only: its import (~4 ms) stays off the start
if TYPE_CHECKING:
    from typing import Iterable


class Chain:
    """Seals each line in turn: body -> body with its digest."""

    def __init__(self):
        self.prev = b""

    def seal(self, body: bytes) -> bytes:
        """`body`: one event's JSON object, no newline, no digest of its own
        (see `unchained`)."""
        digest = sha256(self.prev + body).hexdigest().encode()
        self.prev = digest
        return body[:-1] + b',"d":"' + digest + b'"}'


def unchained(raw: bytes) -> bytes:
    """An event line without its digest: a chained line fed back in (a run
    file replayed) loses its old one; a "d" anywhere else in the object is
    dropped by re-encoding, so a line never holds two."""
    raw = raw.rstrip()
    parts = split_digest(raw)
    if parts is not None:
        return parts[0]
    event = orjson.loads(raw)
    event.pop("d", None)
    return orjson.dumps(event)


class Verdict(FrozenRecord):     # not a dataclass: made as the recorder starts, ~1 ms less
    status: str          # "whole", "broken" or "unchained"
    lines: int           # lines read
    message: str
    digest: str | None = None   # the last good digest (run.end's when whole)
    open_end: bool = False      # broken only at its end (no run.end yet, or a last line being written):
                                # what a run still going looks like

    @property
    def exit_code(self) -> int:
        return {"whole": 0, "broken": 1}.get(self.status, 2)


UNCHAINED = "no digest chain; written by an older vpnw (nothing to verify against)"


def link_problem(prev: bytes, n: int, raw: bytes) -> tuple[str | None, bytes]:
    """Line `n` (with its newline) after a line whose digest is `prev`: (None,
    its digest) when it links, else (what is wrong, b""). The ledger of runs
    (stages/record/ledger.py) is chained the same way."""
    if not raw.endswith(b"\n"):
        return f"line {n} is cut: the file ends inside it", b""
    parts = split_digest(raw[:-1])
    if parts is None:
        return f"line {n} has no digest where vpnw puts one: it was added or changed", b""
    body, digest = parts
    if sha256(prev + body).hexdigest().encode() != digest:
        where = "" if n == 1 else f", or a line before it (after line {n - 1}) was removed"
        return (f"line {n}: the chain breaks here: this line was changed{where}, "
                "or lines were added or moved"), b""
    return None, digest


def verify(lines: Iterable[bytes]) -> Verdict:
    """Check a run file read as lines (with their newlines)."""
    prev = b""
    n = 0
    last_type = None
    for n, raw in enumerate(lines, 1):
        problem, digest = link_problem(prev, n, raw)
        if problem is not None:
            if n == 1 and raw.endswith(b"\n") and split_digest(raw[:-1]) is None \
                    and _has_no_digest(raw[:-1]):
                return Verdict("unchained", n, UNCHAINED)
            # A line without its newline can only be the file's last.
            return Verdict("broken", n, problem, _hex(prev), open_end=not raw.endswith(b"\n"))
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            # Its digest matches but it is not JSON: it was written so.
            event = None
        last_type = event.get("type") if isinstance(event, dict) else None
        if n == 1 and last_type != "run.start":
            return Verdict("broken", n, "line 1 is not run.start: the start of the file was cut")
        prev = digest
    if n == 0:
        return Verdict("broken", 0, "the file is empty")
    if last_type != "run.end":
        return Verdict("broken", n, f"the file ends after line {n} without run.end: it was cut "
                                    "there (or the run was killed before it ended)", _hex(prev),
                       open_end=True)
    return Verdict("whole", n, f"whole and unaltered: {n} lines from run.start to run.end, "
                               f"the digest chain closed by run.end", _hex(prev))


def _has_no_digest(line: bytes) -> bool:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return isinstance(event, dict) and "d" not in event


def _hex(digest: bytes) -> str | None:
    return digest.decode() if digest else None

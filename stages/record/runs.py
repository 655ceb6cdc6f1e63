"""Reading run files back: `vpnw runs`, `vpnw show`, and "the last trace".

Run files are read as streams: a summary reads the first line (run.start) and
the tail of the file (run.end); only a run cut short (no run.end) is read to
the end, one line at a time, to count what it holds. Nothing here loads a
whole file into memory.

"The last run" is the run file whose run.start has the newest timestamp (RFC
3339 UTC with a fixed width, so text order is time order); two runs started in
the same nanosecond are told apart by the file's mtime. "The last trace" is
the same, among runs whose run.start says mode "trace". A file with no
readable run.start has no start time: it is listed (by its mtime) but is
never "the last trace".
"""
from __future__ import annotations

import heapq
import os
from dataclasses import asdict, dataclass, replace
from datetime import datetime

from stages.record import chain, ledger as ledger_mod, signing
from stages.record.events import RecordError, parse_line, read_events, rfc3339_ns
from stages.record.ledger import LEDGER_NAME
from stages.record.text import printable

_TAIL_BYTES = 16384


@dataclass(frozen=True)
class RunSummary:
    id: str
    file: str
    start: str | None          # run.start ts (RFC 3339 UTC), None if the file has none
    program: str | None
    mode: str | None
    connections: int
    denied: int
    would_deny: int
    failed: int
    exit_code: int | None      # None: the run has no run.end (killed, or still running)
    complete: bool
    digest: str | None = None  # the last line's digest (the chain's head), None if unchained
    ledger: str = "-"          # what the ledger says of it (ledger_status)
    state: str = "ended"       # ended | running (its vpnw is alive) | cut (no run.end, and no vpnw)

    def as_dict(self) -> dict:
        return asdict(self)


def _first_event(path: str) -> dict | None:
    with open(path, "rb") as stream:
        for raw in stream:
            if raw.strip():
                try:
                    return parse_line(raw)
                except RecordError:
                    return None
    return None


def _last_event(path: str) -> dict | None:
    with open(path, "rb") as stream:
        stream.seek(0, os.SEEK_END)
        size = stream.tell()
        stream.seek(max(0, size - _TAIL_BYTES))
        tail = stream.read()
    for raw in reversed(tail.split(b"\n")):
        if raw.strip():
            try:
                return parse_line(raw)
            except RecordError:
                continue  # a torn last line, or the cut start of the tail
    return None


def still_running(path: str) -> bool:
    """Whether the run in `path` has no run.end yet and the vpnw that wrote
    its run.start still runs: its record goes on."""
    end = _last_event(path)
    if end is not None and end.get("type") == "run.end":
        return False
    start = start_event(path) or {}
    return vpnw_alive(start.get("pid"), start.get("ts"))


def start_event(path: str) -> dict | None:
    """The run.start of a run file, or None."""
    try:
        event = _first_event(path)
    except OSError:
        return None
    return event if event and event.get("type") == "run.start" else None


def summarize(path: str) -> RunSummary:
    start = start_event(path)
    end = _last_event(path)
    run_id = (start or end or {}).get("run") or os.path.basename(path).removesuffix(".jsonl")
    start_fields = (start or {}).get("fields") or {}
    if end is not None and end.get("type") == "run.end" and "truncated" not in end["fields"]:
        f = end["fields"]
        counts = (f.get("connections", 0), f.get("denied", 0), f.get("would_deny", 0),
                  f.get("failed", 0))
        exit_code, complete = f.get("exit_code"), True
        digest = end.get("d") if isinstance(end.get("d"), str) else None
    else:
        connections = denied = would_deny = failed = 0
        with open(path, "rb") as stream:
            for event in read_events(stream):
                type_ = event["type"]
                if type_ == "conn.request":
                    connections += 1
                elif type_ == "policy.deny":
                    if event["fields"].get("enforced", True) is False:
                        would_deny += 1
                    else:
                        denied += 1
                elif type_ == "conn.fail":
                    failed += 1
        counts = (connections, denied, would_deny, failed)
        exit_code, complete = None, False
        digest = (end or {}).get("d") if isinstance((end or {}).get("d"), str) else None
    state = "ended" if complete else (
        "running" if vpnw_alive((start or {}).get("pid"), (start or {}).get("ts")) else "cut")
    return RunSummary(id=run_id, file=path, start=start["ts"] if start else None,
                      program=start_fields.get("program"), mode=start_fields.get("mode"),
                      connections=counts[0], denied=counts[1], would_deny=counts[2],
                      failed=counts[3], exit_code=exit_code, complete=complete, digest=digest,
                      state=state)


def vpnw_alive(pid, started: str | None = None) -> bool:
    """Whether the vpnw that wrote run.start (its envelope's pid) still runs:
    that pid is alive, is a vpnw, and (given run.start's `ts`) was started
    before the run was: a later process given the number, even another vpnw,
    is not it (a cut record never passes for a run still going)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    if not (b"vpnw" in cmdline or b"stages" in cmdline):
        return False
    return started is None or _started_by(pid, started)


def _started_by(pid: int, ts: str) -> bool:
    """Whether process `pid` began no later than `ts` (RFC 3339 UTC): its
    start in clock ticks after boot (/proc/PID/stat), against boot time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        at = datetime.fromisoformat(ts[:26].rstrip("Z") + "+00:00").timestamp()
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    # btime is whole seconds and ticks are 1/100 s: a second of slack.
    return boot + ticks / os.sysconf("SC_CLK_TCK") <= at + 1.0


def _run_files(directory: str) -> list[str]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [os.path.join(directory, n) for n in names
            if n.endswith(".jsonl") and os.path.isfile(os.path.join(directory, n))]


def _newest_first_key(path: str, start_ts: str | None):
    try:
        mtime_ns = os.stat(path).st_mtime_ns
    except OSError:
        mtime_ns = 0
    return (start_ts or rfc3339_ns(mtime_ns), mtime_ns, path)


def list_runs(directory: str) -> list[RunSummary]:
    """Every run file in `directory`, newest first."""
    summaries = []
    for path in _run_files(directory):
        try:
            summaries.append(summarize(path))
        except OSError:
            continue
    summaries.sort(key=lambda s: _newest_first_key(s.file, s.start), reverse=True)
    return summaries


def last_run(directory: str, mode: str | None = None) -> str | None:
    """The newest run file (by run.start ts; tie: mtime), optionally only
    runs of that mode ("trace": the last trace). None if there is none."""
    best = None
    for path in _run_files(directory):
        start = start_event(path)
        if mode is not None and (start is None or start["fields"].get("mode") != mode):
            continue
        key = _newest_first_key(path, start["ts"] if start else None)
        if best is None or key > best[0]:
            best = (key, path)
    return best[1] if best else None


def ledger_of(directory: str) -> str:
    """The ledger beside a runs directory (vpnw's state directory holds both)."""
    return os.path.join(os.path.dirname(os.path.abspath(directory)), LEDGER_NAME)


def with_ledger(summaries: list[RunSummary], directory: str):
    """(the summaries, each with what the ledger says of it; the ledger's
    entries for files in `directory` that are gone; the ledger's own problem).

    ledger: "ok" (its entry names this file's last digest), "CHANGED" (it
    names another: the file was replaced or rewritten), "unlisted" (no
    entry: a run that was not signed), "-" (no ledger), "?" (a ledger that
    cannot be read: the problem says why). The problem is a sentence."""
    book = ledger_mod.read(ledger_of(directory))
    if not book.exists:
        return summaries, [], None
    if book.unreadable:
        return [replace(s, ledger="?") for s in summaries], [], book.unreadable_text()
    marked = []
    key = _KeyOnce()
    for s in summaries:
        entry = book.by_file(s.file)
        status = "unlisted" if entry is None else (
            "ok" if entry.get("digest") == s.digest and entry.get("run") == s.id
            and _file_holds(s.file, entry, key) else "CHANGED")
        marked.append(replace(s, ledger=status))
    problem = f"the ledger of runs does not verify: {book.problem}" if book.problem else None
    return marked, book.gone_from(directory), problem


class _KeyOnce:
    """This machine's public key, looked up on first use (None: none here)."""

    def __init__(self):
        self._looked, self._key = False, None

    def get(self):
        if not self._looked:
            self._looked = True
            try:
                path = os.path.join(signing.key_dir(), signing.PUBLIC_NAME)
                self._key = (signing.load_public(path) if os.path.exists(path) else
                             signing.load_secret(create=False).public())
            except (signing.KeyProblem, signing.SigningUnavailable, OSError):
                self._key = None
        return self._key


def _file_holds(path: str, entry: dict, key: _KeyOnce) -> bool:
    """Whether the file is still what its ledger entry signed: the last
    digest alone does not say it (a line edited in place leaves the last one
    as it was). The entry's signature over the file's bytes, checked with
    this machine's key (one hash of the file); without a key that can check
    it, the file's digest chain, line by line. As `show --verify` judges."""
    try:
        sig = signing.parse_minisig(entry.get("sig") or "")
        public = key.get()
        if public is not None and sig.key_id == public.key_id:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                digest, _lines = signing.file_digest(fd)
            finally:
                os.close(fd)
            try:
                return signing.check_signature(sig, public, digest) is None
            except signing.SigningUnavailable:
                pass
    except signing.BadSignature:
        return False
    with open(path, "rb") as stream:
        return chain.verify(stream).status == "whole"


class RunNotFound(LookupError):
    pass


class AmbiguousRun(RunNotFound):
    """A run-id prefix that several runs begin with; the message names them."""


class NotARunFile(ValueError):
    """A file given as a run file that is not one; the message names it."""


RUN_FILE_EXPECTED = ("expected a vpnw run file: JSON Lines whose first line is a run.start event "
                     "of record version 1 (docs/record.md; `vpnw runs` lists the run files)")


def first_line_problem(raw: bytes | None) -> str | None:
    """Why the first non-empty line of a file does not begin a run, or None."""
    if raw is None:
        return "it is empty"
    try:
        event = parse_line(raw)
    except RecordError as exc:
        text = str(exc)
        if text.startswith("not JSON"):
            return "its first line is not JSON"
        if text.startswith("unsupported record version"):
            return f"its first line has {text.replace('unsupported ', '')}; this vpnw reads version 1"
        return f"its first line is not an event ({text})"
    if event["type"] != "run.start":
        return f"its first event is {event['type']}, not run.start"
    return None


def first_line(stream) -> bytes | None:
    for raw in stream:
        if raw.strip():
            return raw
    return None


def check_run_file(path: str) -> None:
    """NotARunFile unless `path` begins like a run file (the rest is read as
    a stream later; a run cut short is still a run)."""
    with open(path, "rb") as stream:
        problem = first_line_problem(first_line(stream))
    if problem:
        raise NotARunFile(f"{path} is not a vpnw run file: {problem}; {RUN_FILE_EXPECTED}")


def run_ids(directory: str) -> list[str]:
    """The ids of the run files in `directory` (their names without .jsonl), sorted."""
    return sorted(os.path.basename(p).removesuffix(".jsonl") for p in _run_files(directory))


def resolve_run(run: str | None, directory: str) -> str:
    """RUN as given to `vpnw show` (and `learn --from`): a file, a run id
    (r-36e0ba1c2d3e, or 36e0ba1c2d3e), a prefix of one that names a single
    run (r-36e0, 36e0: as git takes a short hash), or None for the newest run.
    A prefix several runs begin with is refused, naming them (AmbiguousRun)."""
    if run is None:
        path = last_run(directory)
        if path is None:
            raise RunNotFound(f"no runs recorded in {directory}")
        return path
    if os.path.isfile(run):
        return run
    for candidate in (run, "r-" + run):
        path = os.path.join(directory, candidate + ".jsonl")
        if os.path.isfile(path):
            return path
    if run and "/" not in run:
        prefix = run if run.startswith("r-") else "r-" + run
        matches = [i for i in run_ids(directory) if i.startswith(prefix)]
        if len(matches) == 1:
            return os.path.join(directory, matches[0] + ".jsonl")
        if matches:
            raise AmbiguousRun(_ambiguous(run, matches, directory))
    raise RunNotFound(f"no run {run!r}: not a file, and not a run id in {directory}")


def complete_run(incomplete: str, directory: str) -> list[str] | None:
    """What Tab offers for a RUN being typed: the run ids in `directory` that
    begin with it (with or without "r-"); None when it looks like a path
    (the shell completes files then)."""
    if "/" in incomplete or incomplete.startswith((".", "~")):
        return None
    if incomplete.startswith("r-") or not "r-".startswith(incomplete):
        prefix = incomplete if incomplete.startswith("r-") else "r-" + incomplete
    else:
        prefix = "r-"      # "", "r": every run
    try:
        return [i for i in run_ids(directory) if i.startswith(prefix)]
    except OSError:
        return []


_CANDIDATES_SHOWN = 10


def _ambiguous(run: str, matches: list[str], directory: str) -> str:
    """git's "short object ID is ambiguous", for runs: the candidates, newest first."""
    found = []
    for run_id in matches:
        path = os.path.join(directory, run_id + ".jsonl")
        start = start_event(path) or {}
        f = start.get("fields") or {}
        found.append((start.get("ts") or "", run_id, f.get("mode") or "?", f.get("program") or "?"))
    found.sort(reverse=True)
    lines = [f"  {run_id}  {ts[:10]} {ts[11:19]}Z  {printable(mode)} {printable(program)}"
             if ts else f"  {run_id}  {printable(mode)} {printable(program)}"
             for ts, run_id, mode, program in found[:_CANDIDATES_SHOWN]]
    more = len(found) - _CANDIDATES_SHOWN
    if more > 0:
        lines.append(f"  and {more} more")
    return (f"run id {run!r} is ambiguous: {len(found)} runs in {directory} begin with it; "
            f"give more of it (fix: one of these):\n" + "\n".join(lines))


# How far apart, in lines, two events of a run file can stand out of time
# order: several writers share the recorder's pipe (the orchestrator, the
# broker and its workers, each writing a loop turn's events at once), so the
# file holds lines in the order they arrived, and a short program's
# program.exit can land a few lines before the broker's last conn.close.
REORDER_WINDOW = 4096


def in_time_order(events, window: int = REORDER_WINDOW):
    """A run's events in the order their `ts` says they happened (docs/record.md,
    "Order"): lines that arrived out of order within `window` lines are put
    back in order; events with the same `ts` keep the file's order. Streams:
    memory is bounded by the window, never by the length of the record."""
    held: list = []
    for seq, event in enumerate(events):
        ts = event.get("ts") if isinstance(event, dict) else None
        heapq.heappush(held, (ts if isinstance(ts, str) else "", seq, event))
        if len(held) > window:
            yield heapq.heappop(held)[2]
    while held:
        yield heapq.heappop(held)[2]

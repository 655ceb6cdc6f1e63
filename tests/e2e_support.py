"""Helpers shared by the end-to-end tests: read a vpnw run's record and check
that every connection it made is there and accounted for."""
from __future__ import annotations

import json
import os
import pwd
import re
import time
from collections import defaultdict
from pathlib import Path

from progs_support import prog_text
from stages.record.check import check_run, schema_problems
from world import WorldResult

ENVELOPE_KEYS = {"v", "ts", "type", "run", "pid", "path", "conn", "fields", "d"}
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z$")


def describe(result: WorldResult) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def run_events(result: WorldResult) -> list[dict]:
    """The single run file of this vpnw call, parsed strictly as JSON Lines."""
    files = result.run_files()
    assert len(files) == 1, f"expected one run file under {result.state_home}, found {files}\n{describe(result)}"
    events = []
    for n, line in enumerate(files[0].read_bytes().split(b"\n")[:-1], 1):
        event = json.loads(line)
        assert set(event) == ENVELOPE_KEYS, f"line {n}: {event}"
        assert event["v"] == 1 and TS_RE.match(event["ts"]), f"line {n}: {event}"
        events.append(event)
    assert files[0].read_bytes().endswith(b"\n"), "the run file ends mid-line"
    assert events[0]["type"] == "run.start" and events[-1]["type"] == "run.end", [e["type"] for e in events]
    assert len({e["run"] for e in events}) == 1
    return events


def run_files(state_home: Path) -> list[Path]:
    """The run files under `state_home`'s vpnw/runs, by name (none when there is no such folder)."""
    runs = state_home / "vpnw" / "runs"
    return sorted(runs.glob("*.jsonl")) if runs.is_dir() else []


def runs_in(state: Path) -> list[Path]:
    """The run files under `state`'s vpnw/runs, the one written first first."""
    return sorted((state / "vpnw" / "runs").glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns)


def the_record(state_home: Path) -> list[dict]:
    """The events of the one run file under `state_home`, the run well formed (check_run)."""
    files = sorted((state_home / "vpnw" / "runs").glob("*.jsonl"))
    assert len(files) == 1, files
    events = [json.loads(line) for line in files[0].read_bytes().splitlines()]
    assert check_run(events) == [], check_run(events)
    return events


def whole_events(data: bytes) -> list[dict]:
    """Every line of a record whole and a valid event (the run may lack its end)."""
    assert data.endswith(b"\n"), data[-200:]
    events = [json.loads(line) for line in data.split(b"\n")[:-1]]
    for event in events:
        assert schema_problems(event) == [], event
    return events


def complete_record(data: bytes) -> list[dict]:
    """whole_events, and the run well formed (check_run) and ended: run.start to run.end."""
    events = whole_events(data)
    assert check_run(events) == [], check_run(events)
    assert events[0]["type"] == "run.start" and events[-1]["type"] == "run.end"
    return events


def owner(user: str) -> tuple[int, int]:
    """`user`'s uid and gid."""
    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid


def wait_until(predicate, seconds: float = 20.0, what: str = "") -> None:
    """Poll until `predicate()` holds: the point is that it happens, not how fast."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:.0f} s: {what}")
        time.sleep(0.02)


def connections(events: list[dict]) -> dict[int, list[dict]]:
    by_conn: dict[int, list[dict]] = defaultdict(list)
    for event in events:
        if event["conn"] is not None:
            by_conn[event["conn"]].append(event)
    return dict(by_conn)


def assert_every_connection_accounted(events: list[dict]) -> dict[int, list[dict]]:
    """Every conn.request ends in exactly one of deny/fail/open, and every
    open in exactly one close (docs/architecture.md)."""
    by_conn = connections(events)
    for conn, evs in by_conn.items():
        types = [e["type"] for e in evs]
        assert types[0] == "conn.request", (conn, types)
        endings = [t for t in types if t in ("conn.open", "conn.fail")]
        enforced_denials = [e for e in evs if e["type"] == "policy.deny" and e["fields"].get("enforced", True)]
        assert len(endings) + len(enforced_denials) == 1, (conn, types)
        if "conn.open" in types:
            assert types.count("conn.close") == 1 and types[-1] == "conn.close", (conn, types)
    return by_conn


def opened(events: list[dict]) -> list[tuple[str, int, str]]:
    """(host, port, door kind) of every connection that opened, in order."""
    out = []
    for conn, evs in sorted(assert_every_connection_accounted(events).items()):
        if any(e["type"] == "conn.open" for e in evs):
            req = evs[0]["fields"]
            out.append((req["host"], req["port"], req["kind"]))
    return out


def closes(events: list[dict]) -> list[dict]:
    return [e["fields"] for e in events if e["type"] == "conn.close"]


def write_plan(path: Path, plan: list[dict]) -> str:
    text = "".join(json.dumps(op) + "\n" for op in plan)
    path.write_text(text)
    return text


def openat2_ops(directory: str, rel: str, path: str) -> list[dict]:
    """tests/progs/file_probe.py's four openat2(2) ways to `path`: `rel`
    beneath `directory`, the same without crossing a mount, inside /, and
    through /proc/self/root."""
    return [
        {"name": "openat2_beneath", "op": "openat2", "dir": directory, "path": rel, "resolve": ["BENEATH"]},
        {"name": "openat2_no_xdev", "op": "openat2", "dir": directory, "path": rel, "resolve": ["NO_XDEV"]},
        {"name": "openat2_in_root", "op": "openat2", "dir": "/", "path": path, "resolve": ["IN_ROOT"]},
        {"name": "openat2_proc_root", "op": "openat2", "dir": "/proc/self/root", "path": path.lstrip("/"),
         "resolve": ["NO_XDEV", "NO_MAGICLINKS"]},
    ]


def descendants(pid: int) -> list[int]:
    """The processes under `pid` (its children's children too), as /proc shows them now."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):     # gone meanwhile
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found + [d for c in found for d in descendants(c)]


# `python -c IMPORTS_AUDITED_RUN FILE [--collections-too] vpnw-args...`: vpnw
# run as its launcher runs it, every import of every process written to FILE.
IMPORTS_AUDITED_RUN = prog_text("imports_audited_run.py")


def audited_run(world, user, work, args: list[str], tag: str = "",
                python_flags: tuple[str, ...] = ("-I",),
                collections_too: bool = False,
                env: dict | None = None) -> tuple[dict, list[tuple[int, int, str]]]:
    """`vpnw ARGS` as IMPORTS_AUDITED_RUN runs it, traced (VPNW_STARTUP_TRACE):
    each start-up mark as {(stage, what): (ns, pid)}, and every import of
    every process of the run as (ns, pid, module). `tag` names its files
    in `work` (two runs in one test). `collections_too`: each garbage
    collection's start too, as the module "(gc)". `env`: more of vpnw's
    environment."""
    from stages.startup import trace as startup_trace
    trace, imports = work / f"trace{tag}", work / f"imports{tag}"
    more = ["--collections-too"] if collections_too else []
    result = world.run([world.python, *python_flags, "-c", IMPORTS_AUDITED_RUN, str(imports), *more,
                        *args],
                       user=user, env={startup_trace.VARIABLE: str(trace), **(env or {})})
    assert result.returncode == 0, result.stderr
    at = {}
    for line in trace.read_text().splitlines():
        ns, pid, _cpu, stage, what = line.split(" ", 4)
        at[(stage, what)] = (int(ns), int(pid))
    loaded = [(int(ns), int(pid), name) for ns, pid, name in
              (line.split(" ", 2) for line in imports.read_text().splitlines())]
    return at, loaded

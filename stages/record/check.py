"""check_run: does a stream of events keep the promises of docs/record.md?

Pure and streaming: it keeps one small entry per connection number (to catch
a number used twice), never the events themselves. Returns a list of problems (sentences); an empty
list means the run is well formed. Other stages' tests use it on the records
their runs produce.
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Iterable

from stages.record.events import EVENT_TYPES

# The events that end a connection request: exactly one of them per request.
_REQUEST_ENDS = ("policy.deny", "conn.fail", "conn.open")
_CONN_TYPES = {"conn.request", "dns.resolve", "policy.allow", "policy.deny",
               "conn.open", "conn.fail", "conn.close"}
_MAX_PROBLEMS = 200


def load_schema() -> dict:
    return json.loads(resources.files("stages.record").joinpath("schema.json").read_text("utf-8"))


@lru_cache(maxsize=1)
def _validator():
    try:
        import jsonschema
    except ImportError:
        return None
    return jsonschema.Draft202012Validator(load_schema())


def schema_problems(event: dict) -> list[str]:
    """Schema violations of one event ([] when jsonschema is not installed)."""
    validator = _validator()
    if validator is None:
        return []
    out = []
    for error in validator.iter_errors(event):
        where = "/".join(str(p) for p in error.absolute_path) or "event"
        out.append(f"{where}: {error.message}")
    return out


def check_run(events: Iterable[dict]) -> list[str]:
    problems: list[str] = []

    def problem(index: int, event: dict | None, text: str) -> None:
        if len(problems) < _MAX_PROBLEMS:
            label = f"event {index}" + (f" ({event.get('type')}, conn {event.get('conn')})"
                                        if isinstance(event, dict) else "")
            problems.append(f"{label}: {text}")

    requested: dict = {}     # conn -> ended? (False until its end arrives)
    opened: dict = {}        # conn -> closed?
    run_id = None
    seen_start = seen_end = False
    denied = would_deny = 0
    end_fields = None
    index = -1

    for index, event in enumerate(events):
        if not isinstance(event, dict):
            problem(index, None, "not a JSON object")
            continue
        type_ = event.get("type")
        if type_ not in EVENT_TYPES:
            problem(index, event, f"unknown event type {type_!r}")
            continue
        for text in schema_problems(event):
            problem(index, event, f"schema: {text}")
        if run_id is None:
            run_id = event.get("run")
        elif event.get("run") != run_id:
            problem(index, event, f"belongs to run {event.get('run')!r}, not {run_id!r}")
        if index == 0 and type_ != "run.start":
            problem(index, event, "a run begins with run.start")
        if type_ == "run.start":
            if seen_start:
                problem(index, event, "a second run.start")
            seen_start = True
            continue
        if seen_end:
            problem(index, event, "an event after run.end")
        if type_ == "run.end":
            seen_end = True
            end_fields = event.get("fields") or {}
            if not isinstance(end_fields, dict):
                end_fields = {}
            continue
        if type_ not in _CONN_TYPES:
            continue

        conn = event.get("conn")
        fields = event.get("fields") or {}
        if not isinstance(fields, dict) or (conn is not None and not isinstance(conn, int)):
            # Already a schema problem; bookkeeping needs a number and an object.
            problem(index, event, "conn must be an integer and fields an object")
            continue
        if type_ == "conn.request":
            if conn in requested:
                problem(index, event, "a second conn.request for the same connection number")
            requested[conn] = False
            continue
        if type_ == "conn.fail" and conn not in requested and fields.get("stage") == "handshake":
            # A handshake that failed never named a destination: no request before it.
            continue
        if type_ == "conn.close":
            if conn not in opened:
                problem(index, event, "conn.close without conn.open")
            elif opened[conn]:
                problem(index, event, "a second conn.close")
            opened[conn] = True
            continue
        if conn not in requested:
            problem(index, event, "no conn.request before it")
            continue
        if type_ == "policy.deny":
            if fields.get("enforced", True) is False:
                would_deny += 1
                continue
            denied += 1
        if type_ in _REQUEST_ENDS:
            if requested[conn]:
                problem(index, event, "the request already ended (denied, failed or opened)")
            requested[conn] = True
            if type_ == "conn.open":
                opened[conn] = False

    if index < 0:
        return ["no events"]
    if not seen_start:
        problems.append("missing run.start")
    if not seen_end:
        problems.append("missing run.end (was the run killed?)")
    for conn, ended in requested.items():
        if not ended:
            problems.append(f"conn {conn}: conn.request never ended as denied, failed or opened")
    for conn, closed in opened.items():
        if not closed:
            problems.append(f"conn {conn}: conn.open without conn.close")
    if end_fields is not None and "truncated" not in end_fields:
        if end_fields.get("denied") != denied:
            problems.append(f"run.end says {end_fields.get('denied')} denied; the record holds {denied}")
        if end_fields.get("would_deny") != would_deny:
            problems.append(f"run.end says {end_fields.get('would_deny')} would be denied; "
                            f"the record holds {would_deny}")
    return problems

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

from stages.record.event_types import ABOUT_A_CONNECTION
from stages.record.events import EVENT_TYPES

# The events that end a connection request: exactly one of them per request.
_REQUEST_ENDS = ("policy.deny", "conn.fail", "conn.open")
_CONN_TYPES = ABOUT_A_CONNECTION
_MAX_PROBLEMS = 200


def load_schema() -> dict:
    return json.loads(resources.files("stages.record").joinpath("schema.json").read_text("utf-8"))


@lru_cache(maxsize=1)
def _validator():
    try:
        import jsonschema       # optional (the tests' dependency): without it no schema check
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
    checker = _RunChecker()
    index = -1
    for index, event in enumerate(events):
        checker.take(index, event)
    if index < 0:
        return ["no events"]
    return checker.finish()


class _RunChecker:
    """One pass over a run's events; one small entry per connection number."""

    def __init__(self):
        self.problems: list[str] = []
        self.requested: dict = {}     # conn -> ended? (False until its end arrives)
        self.opened: dict = {}        # conn -> closed?
        self.run_id = None
        self.seen_start = self.seen_end = False
        self.denied = self.would_deny = 0
        self.end_fields = None

    def problem(self, index: int, event: dict | None, text: str) -> None:
        if len(self.problems) < _MAX_PROBLEMS:
            label = f"event {index}" + (f" ({event.get('type')}, conn {event.get('conn')})"
                                        if isinstance(event, dict) else "")
            self.problems.append(f"{label}: {text}")

    def take(self, index: int, event) -> None:
        if not isinstance(event, dict):
            self.problem(index, None, "not a JSON object")
            return
        type_ = event.get("type")
        if type_ not in EVENT_TYPES:
            self.problem(index, event, f"unknown event type {type_!r}")
            return
        for text in schema_problems(event):
            self.problem(index, event, f"schema: {text}")
        if self.run_id is None:
            self.run_id = event.get("run")
        elif event.get("run") != self.run_id:
            self.problem(index, event, f"belongs to run {event.get('run')!r}, not {self.run_id!r}")
        if index == 0 and type_ != "run.start":
            self.problem(index, event, "a run begins with run.start")
        if type_ == "run.start":
            if self.seen_start:
                self.problem(index, event, "a second run.start")
            self.seen_start = True
            return
        if self.seen_end:
            self.problem(index, event, "an event after run.end")
        if type_ == "run.end":
            self.seen_end = True
            fields = event.get("fields") or {}
            self.end_fields = fields if isinstance(fields, dict) else {}
        elif type_ in _CONN_TYPES:
            self._conn_event(index, event, type_)

    def _conn_event(self, index: int, event: dict, type_: str) -> None:
        conn = event.get("conn")
        fields = event.get("fields") or {}
        if not isinstance(fields, dict) or (conn is not None and not isinstance(conn, int)):
            # Already a schema problem; bookkeeping needs a number and an object.
            self.problem(index, event, "conn must be an integer and fields an object")
            return
        if type_ == "conn.request":
            if conn in self.requested:
                self.problem(index, event, "a second conn.request for the same connection number")
            self.requested[conn] = False
            return
        if type_ == "conn.fail" and conn not in self.requested and fields.get("stage") == "handshake":
            # A handshake that failed never named a destination: no request before it.
            return
        if type_ == "conn.close":
            if conn not in self.opened:
                self.problem(index, event, "conn.close without conn.open")
            elif self.opened[conn]:
                self.problem(index, event, "a second conn.close")
            self.opened[conn] = True
            return
        if conn not in self.requested:
            self.problem(index, event, "no conn.request before it")
            return
        if type_ == "policy.deny":
            if fields.get("enforced", True) is False:
                self.would_deny += 1
                return
            self.denied += 1
        if type_ in _REQUEST_ENDS:
            if self.requested[conn]:
                self.problem(index, event, "the request already ended (denied, failed or opened)")
            self.requested[conn] = True
            if type_ == "conn.open":
                self.opened[conn] = False

    def finish(self) -> list[str]:
        problems = self.problems
        if not self.seen_start:
            problems.append("missing run.start")
        if not self.seen_end:
            problems.append("missing run.end (was the run killed?)")
        for conn, ended in self.requested.items():
            if not ended:
                problems.append(f"conn {conn}: conn.request never ended as denied, failed or opened")
        for conn, closed in self.opened.items():
            if not closed:
                problems.append(f"conn {conn}: conn.open without conn.close")
        end = self.end_fields
        if end is not None and "truncated" not in end:
            if end.get("denied") != self.denied:
                problems.append(f"run.end says {end.get('denied')} denied; the record holds {self.denied}")
            if end.get("would_deny") != self.would_deny:
                problems.append(f"run.end says {end.get('would_deny')} would be denied; "
                                f"the record holds {self.would_deny}")
        return problems

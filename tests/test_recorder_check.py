"""check_run: the invariants of docs/record.md."""
from __future__ import annotations

import copy
import os

from stages.record.events import read_events
from stages.record.check import check_run

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


def load(name):
    with open(os.path.join(GOLDEN, name + ".jsonl"), "rb") as f:
        return list(read_events(f, strict=True))


def test_the_golden_runs_are_well_formed():
    for name in ("demo_agent_trace", "pip_guard", "dry_run_guard"):
        assert check_run(load(name)) == [], name


def test_nothing_at_all():
    assert check_run([]) == ["no events"]


def test_missing_start_and_end():
    events = load("pip_guard")
    problems = check_run(events[1:-1])
    assert "missing run.start" in problems
    assert "missing run.end (was the run killed?)" in problems
    assert any("a run begins with run.start" in p for p in problems)


def test_a_request_with_no_end():
    events = [e for e in load("pip_guard") if not (e["type"] == "policy.deny" and e["conn"] == 5)]
    problems = check_run(events)
    assert "conn 5: conn.request never ended as denied, failed or opened" in problems


def test_a_request_with_two_ends():
    events = load("pip_guard")
    deny = next(e for e in events if e["type"] == "policy.deny")
    extra = copy.deepcopy(deny)
    extra["type"] = "conn.fail"
    extra["fields"] = {"stage": "dial", "error": "refused", "reason": "refused"}
    events.insert(events.index(deny) + 1, extra)
    problems = check_run(events)
    assert any("the request already ended" in p for p in problems)


def test_open_without_close_and_close_twice():
    events = load("demo_agent_trace")
    close1 = next(e for e in events if e["type"] == "conn.close" and e["conn"] == 1)
    events.remove(close1)
    close2 = next(e for e in events if e["type"] == "conn.close" and e["conn"] == 2)
    events.insert(events.index(close2), copy.deepcopy(close2))
    problems = check_run(events)
    assert "conn 1: conn.open without conn.close" in problems
    assert any("a second conn.close" in p for p in problems)


def test_unknown_type_schema_violation_and_foreign_run():
    events = load("pip_guard")
    odd = copy.deepcopy(events[3])
    odd["type"] = "conn.teleport"
    leak = copy.deepcopy(events[3])
    leak["fields"]["url"] = "/secret?token=1"
    foreign = copy.deepcopy(events[4])
    foreign["run"] = "r-ffffff"
    problems = check_run(events[:3] + [odd, leak, foreign] + events[3:])
    assert any("unknown event type 'conn.teleport'" in p for p in problems)
    assert any("schema:" in p and "url" in p for p in problems)
    assert any("belongs to run 'r-ffffff'" in p for p in problems)


def test_dry_run_denial_is_not_an_end_and_totals_are_checked():
    events = load("dry_run_guard")
    assert check_run(events) == []
    events[-1] = copy.deepcopy(events[-1])
    events[-1]["fields"]["would_deny"] = 0
    assert "run.end says 0 would be denied; the record holds 1" in check_run(events)


def test_a_handshake_failure_needs_no_request():
    events = load("pip_guard")
    bad = copy.deepcopy(next(e for e in events if e["type"] == "conn.fail"))
    bad["conn"] = 99
    bad["fields"] = {"stage": "handshake", "error": "bad-request", "reason": "not a proxy request"}
    events.insert(-2, bad)
    events[-1]["fields"]["failed"] += 1
    assert check_run(events) == []
    bad2 = copy.deepcopy(bad)
    bad2["conn"] = 100
    bad2["fields"]["stage"] = "dial"
    events.insert(-2, bad2)
    assert any("no conn.request before it" in p for p in check_run(events))

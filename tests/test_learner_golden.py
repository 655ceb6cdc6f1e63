"""Recorded runs under tests/golden/ give exactly the saved drafts.

After a deliberate change, regenerate with VPNW_UPDATE_GOLDEN=1 and read the
diff before committing it.
"""
from __future__ import annotations

import os

import pytest

from stages.learner.draft import draft_policy
from stages.config.policy import parse_policy
from stages.record.events import read_events

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
CASES = {
    "demo_agent_trace": (["demo_agent_trace"], "agent"),
    "pip_guard": (["pip_guard"], None),
    "dry_run_guard": (["dry_run_guard"], "agent"),
    "merged": (["dry_run_guard", "pip_guard"], "tools"),
}


def events_of(names):
    for name in names:
        with open(os.path.join(GOLDEN, name + ".jsonl"), "rb") as f:
            yield from read_events(f, strict=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_draft(case):
    names, policy_name = CASES[case]
    draft = draft_policy(events_of(names), policy_name)
    path = os.path.join(GOLDEN, case + ".toml")
    if os.environ.get("VPNW_UPDATE_GOLDEN"):
        with open(path, "w", encoding="utf-8") as f:
            f.write(draft)
    with open(path, encoding="utf-8") as f:
        assert draft == f.read()
    assert draft.startswith("# Read it before you use it.\n")
    parse_policy(draft, f"{case}.toml")


def test_the_demo_draft_allows_the_leak_and_flags_it():
    draft = draft_policy(events_of(["demo_agent_trace"]), "agent")
    policy = parse_policy(draft, "agent.toml")
    allowed = {rule.text for rule in policy.allow}
    # learn allows what the program did, the attacker's server included...
    assert "evil.example" in allowed
    assert "203.0.113.50:8443" in allowed
    assert "nonexistent.example" not in allowed
    # ...and the review block says what to look at.
    review = draft.split("version = 1")[0]
    assert "evil.example: seen once" in review
    assert "mzxw6ytboi2dsmrsgq3dknzq looks generated" in review
    assert "*.t.evil.example could replace 3 names" in review and "do NOT use a wildcard" in review
    assert "*.githubusercontent.com could replace 3 names" in review
    assert "169.254.169.254:80: reached at 169.254.169.254: link-local" in review
    assert "203.0.113.50:8443: port 8443 is neither 80 nor 443" in review
    assert not any(rule.kind == "wildcard" for rule in policy.allow)


def test_the_same_record_gives_the_same_bytes():
    a = draft_policy(events_of(["demo_agent_trace", "pip_guard"]), "x")
    b = draft_policy(events_of(["pip_guard", "demo_agent_trace"]), "x")
    assert a == b

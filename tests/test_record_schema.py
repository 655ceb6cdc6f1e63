"""The schema, record.py and docs/record.md agree; handmade events are judged right."""
from __future__ import annotations

import copy
import glob
import json
import os
import re

import jsonschema
import pytest

from stages.record.events import EVENT_TYPES, encode, parse_line, read_events
from stages.record.check import load_schema, schema_problems

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = sorted(glob.glob(os.path.join(ROOT, "tests", "golden", "*.jsonl")))
SCHEMA = load_schema()


def golden_events():
    for path in GOLDEN:
        with open(path, "rb") as f:
            yield from read_events(f, strict=True)


def test_the_schema_is_a_valid_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_schema_knows_exactly_the_sixteen_types():
    assert len(EVENT_TYPES) == 16
    assert SCHEMA["properties"]["type"]["enum"] == list(EVENT_TYPES)
    assert set(SCHEMA["$defs"]) == set(EVENT_TYPES) | {"truncated"}
    for type_ in EVENT_TYPES:
        assert SCHEMA["$defs"][type_]["additionalProperties"] is False


def test_the_doc_names_every_type_and_field():
    doc = open(os.path.join(ROOT, "docs", "record.md"), encoding="utf-8").read()
    for type_ in EVENT_TYPES:
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{type_}` |")), None)
        assert row is not None, type_
        for name in SCHEMA["$defs"][type_]["properties"]:
            assert re.search(rf"`{re.escape(name)}`", row), (type_, name)
        for name in SCHEMA["$defs"][type_]["properties"]:
            optional = name not in SCHEMA["$defs"][type_]["required"]
            assert (f"`{name}` *optional*" in row) == optional, (type_, name)


def test_every_golden_event_is_valid():
    count = 0
    for event in golden_events():
        assert schema_problems(event) == [], event
        count += 1
    assert count > 50
    assert {e["type"] for e in golden_events()} == set(EVENT_TYPES)


def _one(type_):
    return next(e for e in golden_events() if e["type"] == type_)


@pytest.mark.parametrize("type_", EVENT_TYPES)
def test_an_unexpected_field_is_a_violation(type_):
    event = copy.deepcopy(_one(type_))
    event["fields"]["headers"] = {"Authorization": "Bearer secret"}
    assert any("headers" in p for p in schema_problems(event))


@pytest.mark.parametrize("type_", EVENT_TYPES)
def test_a_missing_required_field_is_a_violation(type_):
    event = copy.deepcopy(_one(type_))
    required = SCHEMA["$defs"][type_]["required"]
    del event["fields"][required[0]]
    assert schema_problems(event)


@pytest.mark.parametrize("mutate,needle", [
    (lambda e: e.update(v=2), "v"),
    (lambda e: e.update(conn=None), "conn"),
    (lambda e: e.update(conn=0), "conn"),
    (lambda e: e.update(args=["--token", "x"]), "args"),
    (lambda e: e.update(ts="yesterday"), "ts"),
    (lambda e: e["fields"].update(port=70000), "port"),
    (lambda e: e["fields"].update(kind="ftp"), "kind"),
    (lambda e: e["fields"].update(host=None), "host"),
])
def test_handmade_bad_conn_request(mutate, needle):
    event = copy.deepcopy(_one("conn.request"))
    mutate(event)
    problems = schema_problems(event)
    assert problems and any(needle in p for p in problems), problems


def test_run_level_events_have_no_conn():
    event = copy.deepcopy(_one("run.start"))
    event["conn"] = 3
    assert schema_problems(event)


def test_optional_fields_and_truncation():
    ok = parse_line(encode("r-abc123", "path.check", {"path": "office", "type": "proxy", "ok": False,
                                                      "ms": 3.5, "error": "refused"}))
    assert schema_problems(ok) == []
    huge = parse_line(encode("r-abc123", "dns.resolve", {"host": "x", "addresses": ["a" * 500] * 64,
                                                         "ms": 1}, conn=1))
    assert huge["fields"] == {"truncated": True}
    assert schema_problems(huge) == []
    end = parse_line(encode("r-abc123", "run.end", {"exit_code": 125, "connections": 0, "denied": 0,
                                                    "would_deny": 0, "failed": 0, "ms": 1.5,
                                                    "error": "the broker failed"}))
    assert schema_problems(end) == []


def test_a_run_start_too_long_for_a_line_keeps_its_fields_and_shortens_its_lists():
    """Before, a run.start past 4000 bytes became {"truncated": true}: the
    mode, the policy and the version were lost with the long lists."""
    start = copy.deepcopy(_one("run.start"))["fields"]
    start["env_kept"] = [f"NAME_{n}" for n in range(10)]
    start["files"] = {"layers": {"deny_read": ["mount"], "allow_write": ["landlock"]},
                      "deny_read": [f"/home/user/secret/{n:03}/" + "x" * 80 for n in range(60)],
                      "deny_read_absent": [], "allow_write": ["/tmp"], "landlock_abi": 6}
    line = encode("r-abc123", "run.start", start)
    assert len(line) <= 4000
    event = parse_line(line)
    assert schema_problems(event) == []
    fields = event["fields"]
    assert fields["mode"] == start["mode"] and fields["version"] == start["version"]
    assert fields["env_kept"] == start["env_kept"]                   # short lists kept whole
    kept = fields["files"]["deny_read"]
    assert kept == start["files"]["deny_read"][:len(kept)] and kept
    assert fields["cut"] == {"files.deny_read": 60 - len(kept)}
    assert fields["files"]["allow_write"] == ["/tmp"]


def test_a_run_start_too_long_even_with_its_lists_empty_is_marked_truncated():
    start = copy.deepcopy(_one("run.start"))["fields"]
    # Control characters: six bytes each in JSON, so two clipped strings are past 4000.
    start.update({k: "\x01" * 600 for k in ("policy", "policy_file")})
    start["env_kept"] = ["A"]
    event = parse_line(encode("r-abc123", "run.start", start))
    assert event["fields"] == {"truncated": True}


def test_the_schema_ships_as_package_data():
    text = json.dumps(SCHEMA)
    assert "conn.request" in text


def test_deny_private_scope_values_agree_in_record_py_the_schema_and_the_doc():
    from stages.record.events import DENY_PRIVATE_SCOPES
    prop = SCHEMA["$defs"]["run.start"]["properties"]["deny_private_scope"]
    assert prop["enum"] == list(DENY_PRIVATE_SCOPES)
    assert "deny_private_scope" not in SCHEMA["$defs"]["run.start"]["required"]
    doc = open(os.path.join(ROOT, "docs", "record.md"), encoding="utf-8").read()
    row = next(line for line in doc.splitlines() if line.startswith("| `run.start` |"))
    for value in DENY_PRIVATE_SCOPES:
        assert f"`{value}`" in row, value

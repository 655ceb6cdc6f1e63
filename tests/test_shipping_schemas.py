"""The OCSF and ECS renderings validate against the schemas their owners publish.

OCSF: the 1.8.0 schema export that the PyPI package `ocsf-json-schema` ships
(downloaded from schema.ocsf.io by its authors), turned into JSON Schema by
that package, with the profiles our documents declare; plus the export's own
enums (every *_id's caption matches its name) and the class's arithmetic
(type_uid = class_uid * 100 + activity_id).

ECS: the field set Elastic publishes as the npm package `@elastic/ecs`
(ecs_flat: every field's name, type, and allowed values); scripts/setup
installs it beside the venv. Every field of every document must be an ECS
field of the right type, `event.*` categorisation values must be allowed
ones, and `event.type` must be one ECS expects for `event.category: network`.

The documents come from every golden record plus handmade hostile runs.
"""
from __future__ import annotations

import glob
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from functools import lru_cache

import pytest

from stages.record.check import schema_problems
from stages.record.events import encode, parse_line, read_events
from stages.recorder.shipping import ecs, ocsf
from stages.recorder.shipping.outcomes import Outcomes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = sorted(glob.glob(os.path.join(ROOT, "tests", "golden", "*.jsonl")))
ECS_FLAT_JS = os.path.join(sys.prefix, "share", "elastic-ecs", "node_modules", "@elastic", "ecs",
                           "build", "commonjs", "ecs_flat.js")


def _cannot(reason):
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def hostile_run() -> list[dict]:
    """A run with names built to break renderers: quotes, backslashes, control
    characters, newlines, non-ASCII, a 600-character name, a handshake that
    never named a destination, an IPv6 literal, a dry-run denial."""
    run, lines = "r-0badc0", []

    def add(type_, conn=None, pid=4242, **fields):
        lines.append(parse_line(encode(run, type_, fields, path="direct", conn=conn, pid=pid)))

    add("run.start", mode="guard", program='ag"ent\\', policy="p", policy_file="/p.toml", via="direct",
        dry_run=True, allow_unix_sockets=False, version="0.1.0", record="/r.jsonl")
    names = ['ev"il\\.example', "new\nline.example\r\n<13>1 - forged", "ü" * 600, "\x1b[31mred\x00",
             "2001:db8::1", "198.51.100.7"]
    for n, host in enumerate(names, 1):
        add("conn.request", n, pid=4243, door="http", kind="http-connect", host=host, port=443)
        if n % 2:
            add("policy.deny", n, pid=4243, rule="default", reason=f"no allow rule matches {host}:443", enforced=True)
        else:
            add("policy.deny", n, pid=4243, rule="default", reason=f"would deny {host}", enforced=False)
            add("conn.open", n, pid=4243, address="198.51.100.7", port=443, via="direct", ms=0.5)
            add("conn.close", n, pid=4243, bytes_up=10, bytes_down=20, ms=3.0)
    add("conn.fail", 99, pid=4243, stage="handshake", error="bad-request", reason="not a proxy request")
    add("conn.request", 100, pid=4243, door="socks", kind="socks5", host="gone.example", port=80)
    add("policy.allow", 100, pid=4243, rule="gone.example", reason="allowed")
    add("conn.fail", 100, pid=4243, stage="dial", error="refused", reason="refused")
    add("run.end", exit_code=120, connections=7, denied=3, would_deny=3, failed=2, ms=5.0)
    return lines


def all_runs() -> list[list[dict]]:
    runs = []
    for path in GOLDEN:
        with open(path, "rb") as f:
            runs.append(list(read_events(f, strict=True)))
    runs.append(hostile_run())
    return runs


def outcomes_of(events):
    folded = Outcomes()
    for event in events:
        yield from folded.feed(event)


def test_the_golden_runs_render_every_kind_of_outcome():
    kinds = {o.kind for run in all_runs() for o in outcomes_of(run)}
    assert kinds == {"open", "close", "refuse", "fail", "unix-refuse", "unix-open"}


# ---------------------------------------------------------------- OCSF

@lru_cache(maxsize=1)
def ocsf_export():
    try:
        from ocsf_json_schema import get_ocsf_schema
    except ImportError:
        _cannot("ocsf-json-schema is not installed (pip install -e .[test])")
    return get_ocsf_schema(version=ocsf.OCSF_VERSION)


@lru_cache(maxsize=1)
def ocsf_validator():
    import jsonschema
    from ocsf_json_schema import OcsfJsonSchemaEmbedded
    schema = OcsfJsonSchemaEmbedded(ocsf_export()).get_class_schema("network_activity", ocsf.PROFILES)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_ocsf_documents_validate_against_the_published_1_8_0_schema():
    validator = ocsf_validator()
    count = 0
    for run in all_runs():
        for outcome in outcomes_of(run):
            doc = ocsf.render(outcome)
            errors = [f"{list(e.path)}: {e.message[:200]}" for e in validator.iter_errors(doc)]
            assert errors == [], (outcome.kind, doc)
            count += 1
    assert count > 30


def test_ocsf_enums_and_ids_are_the_schemas_own():
    export = ocsf_export()
    cls = export["classes"]["network_activity"]
    assert cls["uid"] == ocsf.CLASS_UID and cls["category_uid"] == ocsf.CATEGORY_UID
    attrs = cls["attributes"]
    direction = export["objects"]["network_connection_info"]["attributes"]["direction_id"]["enum"]
    for run in all_runs():
        for outcome in outcomes_of(run):
            doc = ocsf.render(outcome)
            assert doc["type_uid"] == doc["class_uid"] * 100 + doc["activity_id"]
            for name in ("activity", "action", "disposition", "severity", "status"):
                caption = attrs[f"{name}_id"]["enum"][str(doc[f"{name}_id"])]["caption"]
                label = doc[f"{name}_name"] if name == "activity" else doc[name]
                assert label == caption, (name, doc)
            assert direction[str(doc["connection_info"]["direction_id"])]["caption"] == "Outbound"
            assert doc["metadata"]["profiles"] == ocsf.PROFILES
            assert doc["class_name"] == cls["caption"]


def test_ocsf_says_what_happened_to_each_connection():
    docs = [ocsf.render(o) for o in outcomes_of(hostile_run())]
    refused = [d for d in docs if d["activity_id"] == 5]
    assert [d["dst_endpoint"].get("hostname", d["dst_endpoint"].get("ip")) for d in refused] == \
        ['ev"il\\.example', "ü" * 512 + "…", "2001:db8::1"]
    assert all(d["action_id"] == 2 and d["disposition_id"] == 2 for d in refused)
    # Dry run: let through, observed, with the rule that would have denied it.
    dry = [d for d in docs if d["action_id"] == 3]
    assert {d["activity_id"] for d in dry} == {1, 2} and all(d["disposition_id"] == 15 for d in dry)
    close = next(d for d in docs if d["activity_id"] == 2)
    assert close["traffic"] == {"bytes_out": 10, "bytes_in": 20, "bytes": 30}
    failed = [d for d in docs if d["activity_id"] == 4]
    assert "dst_endpoint" not in failed[0] and failed[0]["action_id"] == 0   # a bad handshake
    assert failed[1]["status_code"] == "refused" and failed[1]["action_id"] == 1


# ---------------------------------------------------------------- ECS

@lru_cache(maxsize=1)
def ecs_fields() -> dict:
    node = shutil.which("node")
    if not os.path.isfile(ECS_FLAT_JS) or node is None:
        _cannot(f"ECS's field definitions are not installed at {ECS_FLAT_JS} "
                "(scripts/setup installs the npm package @elastic/ecs; needs node and npm)")
    out = subprocess.run([node, "-e", "process.stdout.write(JSON.stringify(require(process.argv[1]).EcsFlat))",
                          ECS_FLAT_JS], capture_output=True, check=True, timeout=60)
    fields = json.loads(out.stdout)
    assert len(fields) > 1000 and "destination.domain" in fields
    return fields


def flatten(doc: dict, prefix: str = ""):
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name != "labels":
            yield from flatten(value, name + ".")
        else:
            yield name, value


def _type_ok(ecs_type: str, value) -> bool:
    if ecs_type in ("keyword", "constant_keyword", "wildcard", "match_only_text", "text"):
        return isinstance(value, str)
    if ecs_type in ("long", "integer", "short", "byte"):
        return isinstance(value, int) and not isinstance(value, bool)
    if ecs_type == "date":
        return isinstance(value, str) and value.endswith("Z") and "T" in value
    if ecs_type == "ip":
        try:
            ipaddress.ip_address(value)
            return True
        except (ValueError, TypeError):
            return False
    if ecs_type == "boolean":
        return isinstance(value, bool)
    if ecs_type == "object":
        return isinstance(value, dict)
    raise AssertionError(f"no check for ECS type {ecs_type}")


def ecs_problems(doc: dict) -> list[str]:
    fields = ecs_fields()
    problems = []
    for name, value in flatten(doc):
        spec = fields.get(name)
        if spec is None:
            problems.append(f"{name}: not an ECS field")
            continue
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and "array" not in spec.get("normalize", []) and name != "tags":
            problems.append(f"{name}: ECS does not expect an array here")
        if name == "labels":
            if not all(isinstance(v, str) for v in value.values()):
                problems.append("labels: values are keywords")
            continue
        for v in values:
            if not _type_ok(spec["type"], v):
                problems.append(f"{name}: {v!r} is not an ECS {spec['type']}")
        allowed = spec.get("allowed_values")
        if allowed:
            names = {a["name"] for a in allowed}
            problems += [f"{name}: {v!r} is not an allowed value" for v in values if v not in names]
    category = next(a for a in fields["event.category"]["allowed_values"] if a["name"] == "network")
    for t in doc["event"]["type"]:
        if t not in category["expected_event_types"]:
            problems.append(f"event.type {t!r} is not one ECS expects for event.category network")
    return problems


def test_ecs_documents_use_ecs_fields_types_and_values():
    count = 0
    for run in all_runs():
        for outcome in outcomes_of(run):
            doc = ecs.render(outcome)
            assert ecs_problems(doc) == [], doc
            count += 1
    assert count > 30


def test_ecs_checker_catches_what_is_wrong():
    good = ecs.render(next(outcomes_of(hostile_run())))
    assert ecs_problems(good) == []
    for bad in ({"destination": {"hostname": "x"}}, {"event": {**good["event"], "type": ["connection", "deny"]}},
                {"destination": {"port": "443"}}, {"event": {**good["event"], "kind": "connection"}},
                {"event": {**good["event"], "type": ["connection", "creation"]}}):
        assert ecs_problems({**good, **bad}) != [], bad


def test_ecs_says_what_happened_to_each_connection():
    docs = [ecs.render(o) for o in outcomes_of(hostile_run())]
    denied = [d for d in docs if "denied" in d["event"]["type"]]
    assert [d["destination"]["address"] for d in denied] == \
        ['ev"il\\.example', "ü" * 512 + "…", "2001:db8::1"]
    assert denied[0]["rule"] == {"name": "default", "ruleset": "p"}
    assert denied[2]["destination"]["ip"] == "2001:db8::1" and "domain" not in denied[2]["destination"]
    close = next(d for d in docs if "end" in d["event"]["type"])
    assert (close["source"]["bytes"], close["destination"]["bytes"], close["network"]["bytes"]) == (10, 20, 30)
    assert close["tags"] == ["would-deny"]


def test_vpnw_show_format_prints_one_document_per_outcome():
    from click.testing import CliRunner

    from stages.recorder.commands import show_command
    golden = os.path.join(ROOT, "tests", "golden", "pip_guard.jsonl")
    with open(golden, "rb") as f:
        expected = len(list(outcomes_of(read_events(f))))
    for fmt in ("ocsf", "ecs"):
        result = CliRunner().invoke(show_command, ["--format", fmt, golden])
        assert result.exit_code == 0, result.output
        docs = [json.loads(line) for line in result.stdout.splitlines()]
        assert len(docs) == expected
        if fmt == "ocsf":
            assert all(not list(ocsf_validator().iter_errors(d)) for d in docs)
        else:
            assert all(ecs_problems(d) == [] for d in docs)
    result = CliRunner().invoke(show_command, ["--format", "ocsf", "--summary", golden])
    assert result.exit_code == 121
    result = CliRunner().invoke(show_command, ["--format", "cef", golden])
    assert result.exit_code != 0


# ---------------------------------------------------------------- self-contained

def _lone_events() -> list[dict]:
    """A stream joined late (a syslog relay restarted, a table that was full):
    no run.start, no conn.request; a denial, a refused Unix socket and an
    allowed one, each read alone."""
    run = "r-1a7e"

    def one(type_, conn=None, **fields):
        return parse_line(encode(run, type_, fields, path="office", conn=conn, pid=77))
    return [one("policy.deny", 41, rule="deny_private", enforced=True, host="10.77.0.1", port=443,
                door="socks", reason="10.77.0.1: a private address (10.0.0.0/8); deny_private = true"),
            one("unix.deny", path="/var/run/docker.sock", process=14, program="curl",
                reason="a socket bound outside the sandbox"),
            one("unix.allow", path="/run/user/1000/ssh-agent.sock", process=9, program="ssh",
                rule="$SSH_AUTH_SOCK")]


def test_a_denial_read_alone_renders_its_destination_and_unix_sockets_render():
    events = _lone_events()
    for event in events:
        assert schema_problems(event) == [], event
    outcomes = list(outcomes_of(events))
    assert [o.kind for o in outcomes] == ["refuse", "unix-refuse", "unix-open"]
    validator = ocsf_validator()
    docs = [ocsf.render(o) for o in outcomes]
    for doc in docs:
        assert not [e.message for e in validator.iter_errors(doc)], doc
    deny, unix_deny, unix_allow = docs
    assert deny["dst_endpoint"] == {"ip": "10.77.0.1", "port": 443}, deny
    assert deny["firewall_rule"] == {"name": "deny_private"} and deny["activity_id"] == 5
    assert unix_deny["activity_id"] == 5 and unix_deny["action_id"] == 2
    assert unix_deny["dst_endpoint"] == {"name": "/var/run/docker.sock"}
    assert unix_deny["actor"]["process"]["name"] == "curl" and unix_deny["unmapped"] == {"sandbox_pid": 14}
    assert unix_deny["status_detail"] == "a socket bound outside the sandbox"
    assert unix_allow["activity_id"] == 1 and unix_allow["action_id"] == 1
    assert unix_allow["firewall_rule"] == {"name": "$SSH_AUTH_SOCK"}
    ecs_docs = [ecs.render(o) for o in outcomes]
    for doc in ecs_docs:
        assert ecs_problems(doc) == [], doc
    deny, unix_deny, unix_allow = ecs_docs
    assert deny["destination"] == {"address": "10.77.0.1", "ip": "10.77.0.1", "port": 443}, deny
    assert deny["event"]["type"] == ["connection", "denied"] and deny["rule"]["name"] == "deny_private"
    assert unix_deny["destination"] == {"address": "/var/run/docker.sock"}
    assert unix_deny["process"] == {"entity_id": "r-1a7e", "name": "curl", "vpid": 14}
    assert unix_deny["event"]["outcome"] == "failure" and unix_deny["log"]["level"] == "warning"
    assert unix_allow["event"]["type"] == ["connection", "start", "allowed"]
    assert unix_allow["rule"] == {"name": "$SSH_AUTH_SOCK"}

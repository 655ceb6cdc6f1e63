"""The event kinds' types (stages/record/event_types.py): one per kind, held
to schema.json field by field; what they write is the record's bytes, in the
record's order; what they read back is refused when it is not the kind's."""
from __future__ import annotations

import inspect
import os
import re

import pytest

from stages.record import event_types as ev
from stages.record.check import load_schema
from stages.record.events import EVENT_TYPES, Emitter, RecordError, encode, parse_line

from test_record_schema import golden_events

SCHEMA = load_schema()
# An annotation's JSON types, as the schema spells them.
JSON_TYPES = {str: {"string"}, int: {"integer"}, float: {"number", "integer"}, bool: {"boolean"},
              list: {"array"}, dict: {"object"}, type(None): {"null"}}


def _json_types(annotation) -> set[str]:
    kinds = getattr(annotation, "__args__", None) or (annotation,)
    return set().union(*(JSON_TYPES[k] for k in kinds))


def _schema_types(spec: dict) -> set[str] | None:
    if "const" in spec:
        return {"boolean"} if isinstance(spec["const"], bool) else None
    if "enum" in spec:
        return {"string"} if all(isinstance(v, str) for v in spec["enum"]) else None
    kind = spec.get("type")
    return {kind} if isinstance(kind, str) else set(kind) if kind else None


def test_one_type_per_kind_in_the_record_order():
    assert tuple(cls.KIND for cls in ev.TYPES) == EVENT_TYPES
    assert len({cls.__name__ for cls in ev.TYPES}) == len(EVENT_TYPES)


@pytest.mark.parametrize("cls", ev.TYPES, ids=lambda c: c.KIND)
def test_each_type_has_exactly_the_schemas_fields(cls):
    spec = SCHEMA["$defs"][cls.KIND]
    assert set(cls._names) == set(spec["properties"])
    assert {n for n in cls._names if n not in cls._optional} == set(spec["required"])
    for name, annotation in cls._types.items():
        said = _schema_types(spec["properties"][name])
        if said is not None:
            # "number" takes integers too; a field the schema lets be null is null-able here
            assert said <= _json_types(annotation) | ({"integer"} if "number" in said else set()), name
            assert ("null" in said) == (type(None) in getattr(annotation, "__args__", ())), name


def test_the_kinds_with_a_connection_are_those_the_schema_gives_a_conn():
    with_conn = set()
    for rule in SCHEMA["allOf"]:
        kind = rule["if"]["properties"]["type"]["const"]
        if rule["then"]["properties"].get("conn") != {"type": "null"}:
            with_conn.add(kind)
    assert ev.ABOUT_A_CONNECTION == with_conn
    assert {"conn.close", "conn.request"} <= with_conn          # control


def _filled(cls) -> tuple[dict, int | None]:
    """Every field given a value of its own (strings that name their field)."""
    values = {name: f"<{name}>" for name in cls._names}
    return values, (7 if cls._start else None)


@pytest.mark.parametrize("cls", ev.TYPES, ids=lambda c: c.KIND)
def test_new_and_fields_follow_the_annotations(cls):
    """Each kind's written-out __new__ and fields() against its annotations:
    the same names, in the same order, optional ones left out when None."""
    if "__new__" in cls.__dict__:                # written out (the broker's kinds)
        params = inspect.signature(cls.__new__).parameters
        assert list(params)[1:] == list(cls._fields)
        assert {n for n, p in params.items() if p.default is None} == set(cls._optional)
    values, conn = _filled(cls)
    event = cls(*([conn] if conn else []), **values)
    assert list(event.fields().items()) == list(values.items())
    assert event.conn == conn and all(getattr(event, n) == v for n, v in values.items())
    bare = cls(*([conn] if conn else []), **{**values, **dict.fromkeys(cls._optional)})
    assert list(bare.fields()) == [n for n in cls._names if n not in cls._optional]


def test_a_field_that_is_null_when_written_is_not_optional():
    exit_ = ev.ProgramExit(code=None, signal=9)
    assert exit_.fields() == {"code": None, "signal": 9}
    with pytest.raises(TypeError):
        ev.ProgramExit(code=0)                               # signal is required, even as null


def test_types_are_immutable_and_compared_by_kind():
    a = ev.ConnFail(3, stage="dial", error="refused", reason="x")
    with pytest.raises(AttributeError):
        a.reason = "y"
    assert a == ev.ConnFail(3, stage="dial", error="refused", reason="x")
    assert a != ("3", "dial", "refused", "x") and a != tuple(a)
    assert hash(a) == hash(ev.ConnFail(3, stage="dial", error="refused", reason="x"))


def _line(event) -> bytes:
    r, w = os.pipe()
    try:
        Emitter(w, "r-test", path="direct").emit(*event)     # noqa: the typed form, one argument
        return os.read(r, 65536)
    finally:
        os.close(r)
        os.close(w)


def _without_ts(line: bytes) -> bytes:
    return re.sub(rb'"ts":"[^"]*"', b'"ts":""', line)


BROKER_EVENTS = [
    (ev.ConnRequest(4, door="capture", kind="capture", host="pypi.org", port=443,
                    fake_address="198.18.0.2"),
     ("conn.request", 4), dict(door="capture", kind="capture", host="pypi.org", port=443,
                               fake_address="198.18.0.2")),
    (ev.DnsResolve(4, host="pypi.org", addresses=["151.101.0.223"], ms=3),
     ("dns.resolve", 4), dict(host="pypi.org", addresses=["151.101.0.223"], ms=3)),
    (ev.PolicyAllow(4, rule="asked", reason="r", host="pypi.org", port=443, door="http", by="person",
                    answer="once"),
     ("policy.allow", 4), dict(rule="asked", reason="r", host="pypi.org", port=443, door="http",
                               by="person", answer="once")),
    (ev.PolicyDeny(5, rule="secrets.gh.allow", reason="r", enforced=False, host="api.github.com",
                   port=443, door="secret", method="DELETE", path="/repos"),
     ("policy.deny", 5), dict(rule="secrets.gh.allow", reason="r", enforced=False,
                              host="api.github.com", port=443, door="secret", method="DELETE",
                              path="/repos")),
    (ev.ConnOpen(4, address="151.101.0.223", port=443, via="direct", ms=1),
     ("conn.open", 4), dict(address="151.101.0.223", port=443, via="direct", ms=1)),
    (ev.ConnClose(4, bytes_up=812, bytes_down=20417, ms=96),
     ("conn.close", 4), dict(bytes_up=812, bytes_down=20417, ms=96)),
    (ev.ConnFail(6, stage="handshake", error="timeout", reason="x" * 600),     # clipped
     ("conn.fail", 6), dict(stage="handshake", error="timeout", reason="x" * 600)),
    (ev.PathCheck(path="office", type="proxy", ok=False, ms=12, error="down"),
     ("path.check", None), dict(path="office", type="proxy", ok=False, ms=12, error="down")),
    (ev.DnsAnswer(name="pypi.org", type="A", transport="udp", rcode="NOERROR", address="198.18.0.2"),
     ("dns.answer", None), dict(name="pypi.org", type="A", transport="udp", rcode="NOERROR",
                                address="198.18.0.2")),
]


# The orchestrator's events, each with its fields in the order run.py writes
# them in the keyword form (the lead's replacement lines make these types).
ORCHESTRATOR_EVENTS = [
    (ev.RunStart(mode="guard", program="agent", policy="p", policy_file="/p.toml", via="direct",
                 config="/paths.toml", dry_run=False, allow_unix_sockets=False, version="1.0",
                 record="/r.jsonl", files={"layers": {}}, env_kept=["HTTP_PROXY"],
                 deny_private_scope="addresses", deny_private_shadows={"set": "l3", "rules": []},
                 capture=True, ask=True, unix_allow=[{"entry": "/s", "path": "/s"}],
                 unix_allow_unlisted=2, work_set={"paths": ["/w"], "outside": "held"},
                 secrets=[{"name": "gh"}], keys_given=["GH_TOKEN"], protected={"hidden": []}),
     ("run.start", None), dict(mode="guard", program="agent", policy="p", policy_file="/p.toml",
                               via="direct", config="/paths.toml", dry_run=False,
                               allow_unix_sockets=False, version="1.0", record="/r.jsonl",
                               files={"layers": {}}, env_kept=["HTTP_PROXY"],
                               deny_private_scope="addresses",
                               deny_private_shadows={"set": "l3", "rules": []}, capture=True, ask=True,
                               unix_allow=[{"entry": "/s", "path": "/s"}], unix_allow_unlisted=2,
                               work_set={"paths": ["/w"], "outside": "held"}, secrets=[{"name": "gh"}],
                               keys_given=["GH_TOKEN"], protected={"hidden": []})),
    (ev.RunStart(mode="run", program="true", policy=None, policy_file=None, via="direct",
                 dry_run=False, allow_unix_sockets=False, version="1.0", record="-", env_kept=[],
                 protected={"hidden": []}),
     ("run.start", None), dict(mode="run", program="true", policy=None, policy_file=None, via="direct",
                               dry_run=False, allow_unix_sockets=False, version="1.0", record="-",
                               env_kept=[], protected={"hidden": []})),
    (ev.SandboxReady(namespaces=["user", "net"], seccomp=True, unix_sockets=False, unix="own",
                     doors={"http": 3128, "socks": 1080}, local_doors=[11434]),
     ("sandbox.ready", None), dict(namespaces=["user", "net"], seccomp=True, unix_sockets=False,
                                   unix="own", doors={"http": 3128, "socks": 1080}, local_doors=[11434])),
    (ev.UnixAllow(path="/run/s", process=7, program="curl", rule="/run/s"),
     ("unix.allow", None), dict(path="/run/s", process=7, program="curl", rule="/run/s")),
    (ev.UnixDeny(path="/run/d", process=7, program="curl", reason="outside"),
     ("unix.deny", None), dict(path="/run/d", process=7, program="curl", reason="outside")),
    (ev.ProgramExit(code=0, signal=None, no_route=3, loopback_refused=[11434]),
     ("program.exit", None), dict(code=0, signal=None, no_route=3, loopback_refused=[11434])),
    (ev.FilesHeld(count=2, entries=[], truncated=False, unlisted=2),
     ("files.held", None), dict(count=2, entries=[], truncated=False, unlisted=2)),
    (ev.RunEnd(exit_code=0, connections=3, denied=1, would_deny=0, failed=0, ms=812.5, error="e"),
     ("run.end", None), dict(exit_code=0, connections=3, denied=1, would_deny=0, failed=0, ms=812.5,
                             error="e")),
]


@pytest.mark.parametrize("event, envelope, fields", BROKER_EVENTS + ORCHESTRATOR_EVENTS,
                         ids=lambda x: getattr(x, "KIND", ""))
def test_a_type_writes_the_bytes_the_keyword_form_writes(event, envelope, fields):
    """The record's bytes are the same whichever form the writer used: the
    digest chain, the goldens and every reader depend on them."""
    typed = _line((event,))
    assert _without_ts(typed) == _without_ts(_keyword_line(envelope, fields))
    read = ev.decode(parse_line(typed))
    if isinstance(event, ev.ConnFail):           # a long field is clipped on its way in
        assert read.reason == "x" * 512 + "…"
    else:
        assert read == event


def _keyword_line(envelope, fields) -> bytes:
    """The line the keyword form (events.encode, as the goldens are made) writes."""
    return encode("r-test", envelope[0], fields, path="direct", conn=envelope[1], pid=os.getpid())


def test_every_golden_event_decodes_and_gives_its_fields_back():
    """The golden run files (tests/golden): each event is its kind's type,
    and the type gives back its fields. (Their order is make_records.py's,
    by hand; the order runs write is held above, against the keyword form.)"""
    kinds = set()
    for event in golden_events():
        typed = ev.decode(event)
        if isinstance(typed, ev.Truncated):
            continue
        kinds.add(typed.KIND)
        assert typed.fields() == event["fields"], event
        assert typed.conn == event["conn"]
    assert kinds == set(EVENT_TYPES)


@pytest.mark.parametrize("event, needle", [
    ({"type": "conn.close", "conn": 3, "fields": {"bytes_up": 1, "bytes_down": 2}}, "needs 'ms'"),
    ({"type": "conn.close", "conn": 3, "fields": {"bytes_up": 1, "bytes_down": 2, "ms": 1, "x": 1}},
     "no field 'x'"),
    ({"type": "conn.close", "conn": 3, "fields": {"bytes_up": True, "bytes_down": 2, "ms": 1}},
     "bytes_up must be int"),
    ({"type": "conn.close", "conn": None, "fields": {"bytes_up": 1, "bytes_down": 2, "ms": 1}},
     "conn must be a number"),
    ({"type": "run.end", "conn": 2, "fields": {"exit_code": 0, "connections": 0, "denied": 0,
                                              "would_deny": 0, "failed": 0, "ms": 1}},
     "conn must be null"),
    ({"type": "program.exit", "conn": None, "fields": {"code": "0", "signal": None}},
     "code must be"),
    ({"type": "files.gone", "conn": None, "fields": {}}, "unknown event type"),
])
def test_decode_refuses_what_is_not_the_kind(event, needle):
    with pytest.raises(RecordError, match=re.escape(needle)):
        ev.decode(event)


def test_decode_reads_a_truncated_line_as_its_kind_and_conn():
    assert ev.decode({"type": "conn.request", "conn": 9, "fields": {"truncated": True}}) \
        == ev.Truncated("conn.request", 9)
    ok = {"type": "run.end", "conn": None, "fields": {"exit_code": 0, "connections": 1, "denied": 0,
                                                    "would_deny": 0, "failed": 0, "ms": 2.5}}
    assert ev.decode(ok) == ev.RunEnd(exit_code=0, connections=1, denied=0, would_deny=0, failed=0,
                                      ms=2.5)                                 # control


def test_conn_close_is_written_in_one_place():
    """A connection that was opened ends in Journal.close_conn, called by the
    one that holds the connection: a tunnel (sessions._Door.tunnel) or a
    kept-alive client's upstream (sessions.KeptUpstream.drop). Control: the
    scan finds the broker's conn.open, which the connector and the local door write."""
    import ast
    from pathlib import Path
    stages = Path(__file__).resolve().parent.parent / "stages"
    made, calls, opens = [], [], []
    for path in sorted(stages.rglob("*.py")):
        tree = ast.parse(path.read_text())
        scopes = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    scopes.setdefault(id(inner), node.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                where = (path.name, scopes.get(id(node)))
                if name.endswith("ConnClose"):
                    made.append(where)
                elif name.endswith(".close_conn"):
                    calls.append(where)
                elif name.endswith("ConnOpen"):
                    opens.append(where)
    assert made == [("journal.py", "close_conn")]
    assert sorted(calls) == [("sessions.py", "drop"), ("sessions.py", "tunnel")]
    assert {file for file, _ in opens} == {"connector.py", "local_door.py"}     # control

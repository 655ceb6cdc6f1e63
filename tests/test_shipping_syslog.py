"""Syslog messages byte by byte: RFC 5424 header, the local /dev/log format,
octet counting, severities, shrinking instead of cutting, and targets."""
from __future__ import annotations

import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stages.record.events import MAX_LINE, encode, parse_line
from stages.recorder.shipping import stream_renderer
from stages.recorder.shipping.syslog import (
    CEE, SyslogMessages, octet_counted, rfc5424_timestamp, shrink,
)
from stages.recorder.shipping.outcomes import severity
from stages.recorder.shipping.transports import SyslogTarget, TargetError, parse_target

# RFC 5424 §6: HEADER = PRI VERSION SP TIMESTAMP SP HOSTNAME SP APP-NAME SP PROCID SP MSGID
HEADER = re.compile(rb"^<(\d{1,3})>1 (\S+) (\S{1,255}) (\S{1,48}) (\S{1,128}) (\S{1,32}) (-|\[.*?\]) ")
TS = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z$")


def event(type_, conn=None, pid=7001, **fields):
    raw = encode("r-abc123", type_, fields, path="direct", conn=conn, pid=pid,
                 ts_ns=1_790_682_276_754_728_731)
    return parse_line(raw), raw


START = event("run.start", pid=7000, mode="trace", program="agent", policy=None, policy_file=None,
              via="direct", dry_run=False, allow_unix_sockets=False, version="0.1.0", record="-")


def messages(*events, **kw):
    m = SyslogMessages(hostname="build-7", **kw)
    out = []
    for ev, raw in (START,) + events:
        out += m.feed(ev, raw)
    return m, out


def test_an_rfc_5424_message_carries_the_event_behind_cee():
    deny = event("policy.deny", 3, rule="default", reason="no allow rule matches x:443", enforced=True)
    _, out = messages(deny)
    msg = out[-1]
    m = HEADER.match(msg)
    assert m, msg
    pri, ts, host, app, procid, msgid, sd = m.groups()
    assert int(pri) == 1 * 8 + 4                 # facility user, severity warning
    assert ts == b"2026-09-29T11:44:36.754728Z" and TS.match(ts)
    assert (host, app, procid, msgid, sd) == (b"build-7", b"vpnw", b"7000", b"policy.deny", b"-")
    body = msg[m.end():]
    assert body.startswith(CEE) and not body.startswith(b"\xef\xbb\xbf")
    assert orjson.loads(body[len(CEE):]) == deny[0]
    assert body[len(CEE):] + b"\n" == deny[1]        # the record's line, byte for byte


def test_the_local_format_is_what_syslog_3_writes():
    _, out = messages(event("conn.request", 1, door="http", kind="http-connect", host="a.example", port=443),
                      local=True)
    assert re.match(rb"^<14>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d vpnw\[7000\]: @cee:\{", out[-1]), out[-1]


@pytest.mark.parametrize("ev,level", [
    (event("policy.deny", 1, rule="r", reason="x", enforced=True), 4),
    (event("policy.deny", 1, rule="r", reason="x", enforced=False), 5),
    (event("conn.fail", 1, stage="dial", error="refused", reason="x"), 5),
    (event("conn.fail", 1, stage="dial", error="internal", reason="x"), 3),
    (event("path.check", path="p", type="proxy", ok=False, ms=1, error="down"), 3),
    (event("run.end", exit_code=125, connections=0, denied=0, would_deny=0, failed=0, ms=1, error="boom"), 3),
    (event("run.end", exit_code=0, connections=0, denied=0, would_deny=0, failed=0, ms=1), 6),
    (event("conn.open", 1, address="1.2.3.4", port=1, via="direct", ms=1), 6),
])
def test_severity_follows_the_event(ev, level):
    assert severity(ev[0]) == level


def test_timestamps_keep_at_most_microseconds():
    assert rfc5424_timestamp("2026-09-29T11:44:36.754728731Z") == "2026-09-29T11:44:36.754728Z"
    assert rfc5424_timestamp("2026-09-29T11:44:36Z") == "2026-09-29T11:44:36Z"
    assert rfc5424_timestamp("yesterday") == "-"


def test_a_hostname_that_is_not_printable_ascii_is_the_nilvalue():
    m = SyslogMessages(hostname="bad host")
    assert HEADER.match(m.feed(*START)[0]).group(3) == b"-"


def test_octet_counting_frames_by_length_in_octets():
    msg = "<14>1 - - vpnw - - - @cee:{\"h\":\"ü\"}".encode()
    framed = octet_counted(msg)
    length, _, rest = framed.partition(b" ")
    assert int(length) == len(msg) == len(rest) and rest == msg


def test_a_message_too_long_is_shrunk_never_cut():
    long_host = "a" * 500 + ".example"
    req = event("conn.request", 1, door="http", kind="http-connect", host=long_host, port=443)
    for fmt in ("jsonl", "ocsf", "ecs"):
        size = 700 if fmt == "jsonl" else 1200     # the schemas' skeletons are larger
        m = SyslogMessages(hostname="h", fmt=fmt, max_size=size)
        out = []
        for ev, raw in (START, req, event("policy.deny", 1, rule="default",
                                          reason=f"no allow rule matches {long_host}:443", enforced=True)):
            out += m.feed(ev, raw)
        msg = out[-1]
        assert out and all(len(x) <= size for x in out), fmt
        doc = orjson.loads(msg[msg.index(CEE) + len(CEE):])     # whole JSON
        if fmt == "jsonl":
            assert doc["fields"] == {"truncated": True}
        elif fmt == "ocsf":
            assert doc["metadata"]["labels"] == ["truncated"] and doc["activity_id"] == 5
            assert doc["dst_endpoint"]["hostname"].endswith("…")
        else:
            assert doc["tags"] == ["truncated"] and "denied" in doc["event"]["type"]
        assert m.shrunk == (2 if fmt == "jsonl" else 1) and m.unfit == 0


def test_record_lines_never_need_shrinking_at_the_default_size():
    huge = event("dns.resolve", 1, host="ü" * 600, addresses=["2001:db8::%x" % i for i in range(64)], ms=1)
    assert len(huge[1]) <= MAX_LINE
    m, out = messages(huge)
    assert m.shrunk == 0 and orjson.loads(out[-1].split(CEE, 1)[1]) == huge[0]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=700), st.integers(min_value=300, max_value=3000))
def test_shrink_always_gives_whole_json_within_budget(text, budget):
    doc = {"a": text, "b": {"c": [text, "x" * 50]}, "n": 1}
    data = shrink(doc, budget, lambda d: d.setdefault("tags", ["truncated"]))
    if data:
        assert len(data) <= budget
        assert orjson.loads(data)["tags"] == ["truncated"]


def test_hostile_names_stay_inside_their_json_string():
    host = 'ev"il\\.example\n<13>1 2026-01-01T00:00:00Z forged vpnw - - - @cee:{"type":"run.end"}\r\x00'
    req = event("conn.request", 1, door="socks", kind="socks5", host=host, port=443)
    for fmt in ("jsonl", "ocsf", "ecs"):
        for local in (False, True):
            m = SyslogMessages(hostname="h", fmt=fmt, local=local)
            out = []
            for ev, raw in (START, req, event("policy.deny", 1, rule="default", reason="no", enforced=True)):
                out += m.feed(ev, raw)
            for msg in out:
                assert b"\n" not in msg and b"\r" not in msg and b"\x00" not in msg
                # The first cookie is the real one: nothing before it comes from the program.
                assert msg.index(CEE) < msg.index(b"{")
            docs = [orjson.loads(msg.split(CEE, 1)[1]) for msg in out]
            if fmt == "jsonl":
                assert docs[1]["fields"]["host"] == host
            elif fmt == "ocsf":
                assert docs[-1]["dst_endpoint"]["hostname"] == host
            else:
                assert docs[-1]["destination"]["domain"] == host


def test_only_connection_outcomes_render_in_the_security_schemas():
    for fmt in ("ocsf", "ecs"):
        render = stream_renderer(fmt)
        assert render(*START) == []
        assert render(*event("conn.request", 1, door="http", kind="http-connect", host="a", port=1)) == []
        assert len(render(*event("conn.open", 1, address="192.0.2.1", port=1, via="direct", ms=1))) == 1
    with pytest.raises(ValueError):
        stream_renderer("cef")


@pytest.mark.parametrize("text,target", [
    (None, SyslogTarget("unix", path="/dev/log")),
    ("/run/vpnw-test/log.sock", SyslogTarget("unix", path="/run/vpnw-test/log.sock")),
    ("udp://127.0.0.1:514", SyslogTarget("udp", host="127.0.0.1", port=514)),
    ("tcp://[::1]:6514", SyslogTarget("tcp", host="::1", port=6514)),
    ("tcp://logs.example:10514", SyslogTarget("tcp", host="logs.example", port=10514)),
])
def test_targets(text, target):
    assert parse_target(text) == target
    assert parse_target(str(target)) == target


@pytest.mark.parametrize("text", ["udp://127.0.0.1", "http://h:1", "tcp://[::1]514", "udp://::1:514",
                                  "udp://h:0", "udp://h:65536", "udp://h:x", "dev/log", "tcp://:514",
                                  "/dev/\0log"])
def test_bad_targets_say_what_to_write(text):
    with pytest.raises(TargetError):
        parse_target(text)


def test_the_command_line_takes_syslog_with_or_without_a_target(monkeypatch):
    from click.testing import CliRunner

    from stages.orchestrator import cli
    seen = []
    monkeypatch.setattr(cli, "_execute", lambda mode, program, **opts: seen.append(opts) or 0)
    runner = CliRunner()
    assert runner.invoke(cli.cli, ["run", "--syslog", "--", "true"]).exit_code == 0
    assert runner.invoke(cli.cli, ["run", "--syslog", "tcp://[::1]:514", "--events-format", "ocsf",
                                   "--", "true"]).exit_code == 0
    assert runner.invoke(cli.cli, ["run", "--", "true"]).exit_code == 0
    # No --events-format: None here, jsonl once _execute has checked it (_check_side_outputs).
    assert [(o["syslog"], o["events_format"]) for o in seen] == \
        [("/dev/log", None), ("tcp://[::1]:514", "ocsf"), (None, None)]
    assert cli._check_side_outputs(None, "/dev/log", None) == "jsonl"
    bad = runner.invoke(cli.cli, ["run", "--events-format", "cef", "--", "true"])
    assert bad.exit_code != 0 and len(seen) == 3


def test_a_bad_syslog_target_is_a_usage_error():
    from stages.orchestrator.cli import UsageProblem, _check_syslog_target
    with pytest.raises(UsageProblem) as info:
        _check_syslog_target("udp://collector")
    assert info.value.exit_code == 121 and "--syslog" in info.value.message and ":514" in info.value.message
    assert _check_syslog_target("udp://[::1]:514/") == "udp://[::1]:514"


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=False)
                     | st.text(max_size=40),
                     lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8),
                                                                                        children, max_size=3),
                     max_leaves=8)
_FIELD_NAMES = ["host", "port", "addresses", "address", "rule", "reason", "enforced", "bytes_up",
                "bytes_down", "ms", "error", "stage", "program", "version", "policy", "truncated", "door", "kind"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["run.start", "conn.request", "dns.resolve", "policy.allow",
                                           "policy.deny", "conn.open", "conn.fail", "conn.close", "run.end"]),
                          st.one_of(st.none(), st.integers(1, 4)),
                          st.dictionaries(st.sampled_from(_FIELD_NAMES), _JSON, max_size=6)),
                max_size=12))
def test_renderings_never_fail_on_odd_events(items):
    """A hand-edited or foreign run file (any field of any type) renders or is
    skipped; it never raises, and every message is whole JSON behind @cee:."""
    for fmt in ("jsonl", "ocsf", "ecs"):
        m = SyslogMessages(hostname="h", fmt=fmt, max_size=2048)
        for type_, conn, fields in items:
            ev = {"v": 1, "ts": "2026-09-29T11:44:36.754728731Z", "type": type_, "run": "r-abc123",
                  "pid": 1, "path": "direct", "conn": conn, "fields": fields}
            for msg in m.feed(ev, orjson.dumps(ev)):
                assert len(msg) <= 2048
                orjson.loads(msg.split(CEE, 1)[1])


@pytest.mark.parametrize("ms", [-1, -9223372036855, 2**63, 10**13, float("nan"), float("inf"), True, "5"])
def test_an_odd_duration_is_left_out_not_a_failure(ms):
    # Found by the property test above: an "ms" whose nanoseconds overflow
    # 64 bits broke the ECS rendering; a negative one made a start after the end.
    events = [{"v": 1, "ts": "2026-11-30T10:00:00.000000000Z", "type": t, "run": "r-x", "pid": 1,
               "path": "direct", "conn": 1, "fields": f} for t, f in
              (("conn.request", {"door": "socks", "kind": "socks5", "host": "a.test", "port": 443}),
               ("conn.open", {"address": "140.82.112.6", "port": 443, "via": "direct", "ms": 1}),
               ("conn.close", {"bytes_up": 1, "bytes_down": 2, "ms": ms}))]
    for fmt in ("ocsf", "ecs"):
        render = stream_renderer(fmt)
        docs = [orjson.loads(d) for e in events for d in render(e, orjson.dumps(e))]
        closed = docs[-1]
        assert "duration" not in closed and "duration" not in closed.get("event", {}), (fmt, closed)


def test_a_udp_target_nobody_listens_on_is_said_so_not_slow(capfd):
    """Loopback only: a port bound and closed again, so nothing listens."""
    import socket
    import time

    from stages.recorder.syslog_out import SyslogOut
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    out = SyslogOut(f"udp://127.0.0.1:{port}")
    raw = encode("r-1", "program.exit", {"code": 0, "signal": None}, pid=7001)
    for _ in range(20):          # the ICMP answer turns the next send into ECONNREFUSED
        out.write(parse_line(raw), raw)
        time.sleep(0.01)
    out.close()
    said = capfd.readouterr().err
    assert f"syslog udp://127.0.0.1:{port} refuses messages: nothing listens there" in said, said
    assert "not keeping up" not in said and out.lost > 0

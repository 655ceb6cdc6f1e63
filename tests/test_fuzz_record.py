"""The record reader and checker, and the paths config, on hostile input:
parse_line accepts an event or raises RecordError; read_events never raises
unless strict; check_run returns sentences for anything at all; load_config
accepts a config or raises ConfigError (and never shows a password)."""
from __future__ import annotations

import io

import json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stages.config.paths import ConfigError, load_config
from stages.record.events import EVENT_TYPES, RecordError, parse_line, read_events
from stages.record.check import check_run

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)

events = st.fixed_dictionaries(
    {}, optional={"v": st.one_of(st.just(1), json_values), "ts": st.one_of(st.just("2026-01-01T00:00:00.000000000Z"), json_values),
                  "type": st.one_of(st.sampled_from(EVENT_TYPES), json_values),
                  "run": st.one_of(st.just("r-abcdef"), json_values), "pid": json_values,
                  "path": json_values, "conn": st.one_of(st.integers(0, 5), json_values),
                  "fields": st.one_of(st.dictionaries(st.sampled_from(
                      ["stage", "enforced", "denied", "would_deny", "exit_code", "truncated", "host"]),
                      json_values, max_size=4), json_values)})

def _dumps(value) -> bytes:
    # json, not orjson: big integers and lone surrogates are fair game here.
    return json.dumps(value).encode()


lines = st.one_of(events.map(_dumps), json_values.map(_dumps), st.binary(max_size=60))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines, max_size=12), st.sampled_from([b"\n", b"\r\n"]))
def test_any_file_reads_without_raising_and_checks_into_sentences(raw_lines, sep):
    data = sep.join(raw_lines)
    read = list(read_events(io.BytesIO(data)))
    for event in read:
        assert isinstance(event, dict) and event["type"] in EVENT_TYPES
    problems = check_run(read)
    assert all(isinstance(p, str) for p in problems)
    try:
        list(read_events(io.BytesIO(data), strict=True))
    except RecordError:
        pass


@settings(max_examples=200, deadline=None)
@given(lines)
def test_parse_line_is_an_event_or_a_record_error(line):
    try:
        event = parse_line(line)
    except RecordError:
        return
    assert event["v"] == 1 and event["type"] in EVENT_TYPES and isinstance(event["fields"], dict)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(events, json_values), max_size=10))
def test_check_run_takes_any_sequence_of_values(values):
    assert all(isinstance(p, str) for p in check_run(values))


def test_check_run_names_a_list_as_conn_instead_of_raising():
    # Regression (hypothesis): an unhashable conn or a non-object fields raised TypeError.
    for event in ({"v": 1, "type": "conn.request", "conn": []},
                  {"v": 1, "type": "conn.open", "conn": 1, "fields": [1]},
                  {"v": 1, "type": "run.end", "fields": "x"}):
        problems = check_run([event])
        assert problems and all(isinstance(p, str) for p in problems)


config_lines = st.sampled_from([
    "version = 1", 'name = "office"', "version = 2", 'default = "office"', 'default = "nope"',
    "[paths.office]", "[paths.x]", "[paths]", 'type = "proxy"', 'type = "direct"', 'type = 3',
    'url = "socks5h://10.8.0.1:1080"', 'url = "http://u:p@10.0.0.1:3128"', 'url = "socks5://[::1]:1"',
    'url = "https://10.0.0.1"', 'url = "socks5h://h:99999"', 'url = "ftp://x"', 'url = ""',
    'username = "u"', 'password_env = "VPNW_PW"', 'password = "secret"', 'ca_file = "x.pem"',
    "[[paths.office]]", "paths = 1", 'name = ""', "x = [", "= 1"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(config_lines, st.text(max_size=30)), max_size=12))
def test_any_config_loads_or_raises_config_error_without_the_password(tmp_path, parts):
    path = tmp_path / "paths.toml"
    path.write_text("\n".join(parts), encoding="utf-8", errors="surrogatepass")
    try:
        config = load_config(str(path), env={"VPNW_PW": "secret"})
    except ConfigError as exc:
        assert "secret" not in str(exc)
        return
    for spec in config.paths.values():
        assert "secret" not in repr(spec)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_any_bytes_as_config_load_or_raise_config_error(tmp_path, raw):
    path = tmp_path / "paths.toml"
    path.write_bytes(raw)
    try:
        load_config(str(path), env={})
    except ConfigError:
        pass

"""Status messages (stages/wire/status.py) and how the orchestrator takes them.

The codec: every kind round-trips, and anything that is not a message the
channel carries (junk, unknown kinds, a key too many, a field of the wrong
type) is refused with StatusError and nothing else.

The orchestrator: real processes stand in for the helper, the broker and the
recorder and write scripted status lines into the real pipes of a real
`RunWatch`; the thing under test is how the orchestrator turns what they say into
the program's start (or not) and vpnw's exit code.
"""
from __future__ import annotations

import os
import signal
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from stages.wire import status as st
from stages.wire.exits import ExitCode
from stages.orchestrator.watch import RunWatch, StageLinks
from stages.record.events import Emitter, read_events

SAMPLES = [
    st.Ready(namespaces=("user", "net", "pid", "ipc", "mnt"), seccomp=True, unix_sockets=False,
             doors=(("http", 3128), ("socks", 1080))),
    st.SandboxFailed("cannot create namespaces", ExitCode.NO_SANDBOX),
    st.SandboxFailed("the sandbox helper failed: OSError(9)", ExitCode.INTERNAL),
    st.ExecFailed("prog: not found (No such file or directory)", ExitCode.NOT_FOUND),
    st.ExecFailed("prog: cannot be executed (Permission denied)", ExitCode.CANNOT_EXECUTE),
    st.Exited(0, None),
    st.Exited(137, 9),
    st.Stopped(20),
    st.InitOk(),
    st.InitFailed("cannot mount /proc"),
    st.PathOk(path="office", type="proxy", ms=12),
    st.PathDown(path="office", error="127.0.0.1:9 refused the connection"),
    st.Totals(connections=3, denied=1, would_deny=0, failed=2),
    st.Ready(namespaces=("user", "net"), seccomp=True, unix_sockets=False, unix="own",
             doors=(("http", 3128), ("socks", 1080)), local=(11434, 8080)),
    st.LoopbackRefused(port=11434, process=7, program="curl"),
    st.UnixConnect(path="/run/docker.sock", allowed=False, process=7, program="curl",
                   reason="a socket bound outside the sandbox"),
]
ALL_KINDS = (st.Ready, st.SandboxFailed, st.ExecFailed, st.Exited, st.Stopped, st.InitOk,
             st.InitFailed, st.PathOk, st.PathDown, st.Totals, st.UnixConnect, st.LoopbackRefused)


def test_the_samples_cover_every_kind():
    assert {type(m) for m in SAMPLES} == set(ALL_KINDS) == set(st._KINDS.values())


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_kind_round_trips(message):
    line = st.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert st.decode(line.rstrip(b"\n"), ALL_KINDS) == message
    assert st.decode(line.rstrip(b"\n"), (type(message),)) == message


def test_the_wire_form_is_the_documented_one():
    assert st.encode(SAMPLES[0]) == (b'{"ready":{"namespaces":["user","net","pid","ipc","mnt"],'
                                     b'"seccomp":true,"unix_sockets":false,"unix":"none",'
                                     b'"doors":{"http":3128,"socks":1080}}}\n')
    assert st.encode(SAMPLES[-1]) == (b'{"unix":{"path":"/run/docker.sock","allowed":false,'
                                      b'"process":7,"program":"curl",'
                                      b'"reason":"a socket bound outside the sandbox"}}\n')
    assert st.encode(st.SandboxFailed("x", ExitCode.INTERNAL)) == b'{"error":"x","code":125}\n'
    # The local doors' ports only when a localhost:PORT rule opened some.
    assert st.encode(SAMPLES[-3]).endswith(b'"doors":{"http":3128,"socks":1080},"local":[11434,8080]}}\n')
    assert st.encode(SAMPLES[-2]) == b'{"loopback_refused":{"port":11434,"process":7,"program":"curl"}}\n'
    assert st.encode(st.Exited(1, None)) == b'{"exit":{"code":1,"signal":null}}\n'
    assert st.encode(st.Totals()) == (b'{"totals":{"connections":0,"denied":0,"would_deny":0,'
                                      b'"failed":0}}\n')


def test_each_channel_carries_only_its_kinds():
    with pytest.raises(st.StatusError, match="does not carry"):
        st.decode(st.encode(st.Totals()), st.HELPER_STATUS)
    with pytest.raises(st.StatusError, match="does not carry"):
        st.decode(st.encode(st.Ready((), True, False, ())), st.BROKER_STATUS)
    with pytest.raises(st.StatusError, match="does not carry"):
        st.decode(st.encode(st.InitOk()), st.HELPER_STATUS)
    with pytest.raises(st.StatusError, match="does not carry"):
        st.decode(st.encode(st.Exited(0, None)), st.PROGRAM_REPORT)


JUNK = [
    b"", b"not json", b"[]", b"42", b'"ready"', b"{}", b'{"ready": null}',
    b'{"hello": 1}',                                         # unknown kind
    b'{"exit": {"code": 0, "signal": null}, "extra": 1}',    # a key too many
    b'{"exit": {"code": 0}}',                                # a field missing
    b'{"exit": {"code": 0, "signal": null, "x": 1}}',        # a field too many
    b'{"exit": {"code": "0", "signal": null}}',              # wrong type
    b'{"exit": {"code": true, "signal": null}}',             # bool is not a number here
    b'{"exit": {"code": 256, "signal": null}}',              # out of range
    b'{"exit": {"code": 0, "signal": 0}}',
    b'{"error": "x", "code": 121}',                          # not a sandbox failure's code
    b'{"error": "x", "code": 127}',
    b'{"exec_error": "x", "code": 122}',
    b'{"exec_error": 5, "code": 127}',
    b'{"error": "x"}',
    b'{"init": "maybe"}',
    b'{"stopped": 0}', b'{"stopped": "SIGTSTP"}', b'{"stopped": 20, "code": 1}',
    b'{"ready": {"namespaces": "user", "seccomp": true, "unix_sockets": false, "doors": {}}}',
    b'{"ready": {"namespaces": [], "seccomp": 1, "unix_sockets": false, "doors": {}}}',
    b'{"ready": {"namespaces": [], "seccomp": true, "unix_sockets": false, "doors": {"http": 0}}}',
    b'{"ready": {"namespaces": [1], "seccomp": true, "unix_sockets": false, "doors": {}}}',
    b'{"ready": {"namespaces": [], "seccomp": true, "unix_sockets": false, "unix": "some",'
    b' "doors": {}}}',
    b'{"unix": {"path": "/x", "allowed": 1, "process": 1, "program": "p", "reason": "r"}}',
    b'{"unix": {"path": "/x", "allowed": false, "process": -1, "program": "p", "reason": "r"}}',
    b'{"unix": {"path": "/x", "allowed": false, "process": 1, "program": "p"}}',
    b'{"path_ok": {"path": "direct", "type": "direct", "ms": -1}}',
    b'{"path_down": {"path": "x"}}',
    b'{"totals": {"connections": 1, "denied": 0, "would_deny": 0, "failed": 0.5}}',
    b'{"totals": {"connections": -1, "denied": 0, "would_deny": 0, "failed": 0}}',
    b'{"error": "' + b"x" * (st.MAX_TEXT + 1) + b'", "code": 122}',
    b'{"init_error": "' + b"x" * (st.MAX_LINE + 1) + b'"}',
]


@pytest.mark.parametrize("line", JUNK)
def test_junk_is_refused(line):
    with pytest.raises(st.StatusError):
        st.decode(line, ALL_KINDS)


def test_a_producer_cannot_send_what_a_reader_would_refuse():
    for message in (st.SandboxFailed("x", ExitCode.PATH_DOWN), st.ExecFailed("x", 1),
                    st.Exited(0, 0), st.Exited(True, None), st.Totals(connections=-1),
                    st.PathOk("direct", "direct", 0.5), st.InitFailed("x" * (st.MAX_TEXT + 1))):
        with pytest.raises(st.StatusError):
            st.encode(message)


def test_kinds_are_equal_only_to_their_own_kind():
    assert st.Exited(0, None) == st.Exited(0, None) and st.Exited(0, None) != (0, None)
    assert st.InitFailed("x") != st.InitFailed("y")
    assert st.PathDown("a", "b") != st.InitFailed("a") and st.InitOk() != ()
    assert len({st.Exited(0, None), st.Exited(0, None), st.Totals()}) == 2


@settings(max_examples=400, deadline=None)
@given(hs.recursive(hs.none() | hs.booleans() | hs.integers(-2**63, 2**63 - 1)
                    | hs.floats(allow_nan=False)
                    | hs.text(max_size=20),
                    lambda inner: hs.lists(inner, max_size=4)
                    | hs.dictionaries(hs.sampled_from(["ready", "error", "code", "exec_error",
                                                       "exit", "signal", "init", "init_error",
                                                       "path_ok", "path_down", "totals", "path",
                                                       "type", "ms", "namespaces", "seccomp",
                                                       "unix_sockets", "doors", "connections", "unix",
                                                       "allowed", "process", "program", "reason",
                                                       "denied", "would_deny", "failed", "x"]),
                                      inner, max_size=5),
                    max_leaves=12))
def test_decode_either_returns_a_message_that_round_trips_or_raises_status_error(value):
    import orjson
    line = orjson.dumps(value)
    try:
        message = st.decode(line, ALL_KINDS)
    except st.StatusError:
        return
    assert st.decode(st.encode(message).rstrip(b"\n"), ALL_KINDS) == message


@given(hs.binary(max_size=200))
def test_decode_of_any_bytes_raises_only_status_error(data):
    try:
        st.decode(data, ALL_KINDS)
    except st.StatusError:
        pass


_ANY_TEXT = hs.text(hs.characters(blacklist_categories=("Cs",)), max_size=30)
_MESSAGES = hs.one_of(
    hs.builds(st.SandboxFailed, _ANY_TEXT, hs.sampled_from(st._SANDBOX_CODES)),
    hs.builds(st.ExecFailed, _ANY_TEXT, hs.sampled_from(st._EXEC_CODES)),
    hs.builds(st.InitFailed, _ANY_TEXT),
    hs.builds(st.Exited, hs.integers(0, 255), hs.none() | hs.integers(1, 64), hs.integers(0, 2**53)),
    hs.builds(st.PathDown, path=_ANY_TEXT, error=_ANY_TEXT),
    hs.builds(st.UnixConnect, path=_ANY_TEXT, allowed=hs.booleans(), process=hs.integers(0, 2**22),
              program=_ANY_TEXT, reason=_ANY_TEXT),
    hs.builds(st.Ready, namespaces=hs.lists(_ANY_TEXT, max_size=5).map(tuple), seccomp=hs.booleans(),
              unix_sockets=hs.booleans(), unix=hs.sampled_from(st.UNIX_MODES),
              doors=hs.dictionaries(_ANY_TEXT, hs.integers(1, 65535), max_size=3).map(
                  lambda d: tuple(d.items())),
              local=hs.lists(hs.integers(1, 65535), max_size=3).map(tuple)),
    hs.sampled_from(SAMPLES))


@settings(max_examples=300, derandomize=True)
@given(_MESSAGES)
def test_the_lines_are_the_bytes_orjson_wrote(message):
    """The helper's lines are written with the standard library's json (no
    orjson on its way to Ready, docs/architecture.md "Start-up budget"):
    byte for byte what orjson made of the same message, control characters,
    quotes and any Unicode included, so either end may be the older one."""
    import orjson
    assert st.encode(message) == orjson.dumps(message.to_wire()) + b"\n"


ODD_LINES = [b'{"stopped":NaN}', b'{"stopped":Infinity}', b'{"stopped":-Infinity}',
             b'{"init_error":"\\ud800"}', b'{"init_error":"\\udc80x"}', b'{"init_error":"\xff"}',
             b'{"init_error":"\xed\xa0\x80"}', b'\xef\xbb\xbf{"init":"ok"}', b'{"init":"ok"}\x00',
             b'\xff\xfe{\x00}\x00', b'{"stopped":1' + b'0' * 5000 + b'}', b'[' * 5000 + b']' * 5000,
             b'{"stopped":20.0}', b'{"stopped":2e1}', b'{"stopped":true}', b' {"init":"ok"} ',
             b'{"init":"ok","init":"ok"}', b'{"stopped":20,"stopped":21}', b'{"init":"\\u006fk"}',
             b'{"init_error":"\\ud83d\\ude00"}', b'{"init_error":"\x01"}', b"{'init':'ok'}"]


@pytest.mark.parametrize("line", ODD_LINES)
def test_a_line_is_read_as_orjson_read_it(line):
    """What decode accepts, and the message it makes, is what it was with
    orjson: lone surrogates, NaN, Infinity, non-UTF-8 bytes, a BOM, huge
    numbers and deep nesting are refused (as StatusError, never another
    exception); the rest reads the same."""
    import orjson
    try:
        expected = st._KINDS[frozenset(orjson.loads(line))].from_wire(orjson.loads(line))
    except (orjson.JSONDecodeError, st.StatusError, KeyError, TypeError, RecursionError):
        expected = st.StatusError
    try:
        got = st.decode(line, ALL_KINDS)
    except st.StatusError:
        got = st.StatusError
    assert got == expected


def test_reader_takes_lines_across_reads_and_refuses_an_endless_one():
    r, w = os.pipe()
    try:
        reader = st.StatusReader(r, st.BROKER_STATUS)
        line = st.encode(st.PathOk("direct", "direct", 0))
        os.write(w, line[:5])
        assert reader.messages() == []
        os.write(w, line[5:] + st.encode(st.Totals(1, 0, 0, 0)))
        assert reader.messages() == [st.PathOk("direct", "direct", 0), st.Totals(1, 0, 0, 0)]
        os.write(w, b"x" * 4096)
        while len(reader.buf) <= st.MAX_LINE:
            try:
                reader.feed()
            except st.StatusError:
                break
            os.write(w, b"x" * 4096)
        else:
            with pytest.raises(st.StatusError):
                reader.feed()
    finally:
        os.close(r)
        os.close(w)


# ------------------------------------------------------------ the orchestrator

def _stand_in(body) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            body()
        except BaseException:  # noqa: BLE001 - a child must never return into pytest
            code = 99
        os._exit(code)
    return pid


def _write_lines(fd: int, lines) -> None:
    # One write (below PIPE_BUF): the orchestrator reads all these lines at
    # once or none of them, so what it decides does not hang on timing.
    data = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines)
    assert len(data) <= 4096
    if data:
        os.write(fd, data)


def scripted_run(helper_before_go, helper_after_go, broker_lines, tmp_path):
    """Run a real `RunWatch` against stand-ins that say the given lines.

    The helper stand-in says `helper_before_go`, waits for the go pipe and,
    only if it got the go byte, says `helper_after_go` and writes the file
    `started`. Returns (exit code, message, events, started?, helper killed?)."""
    events_r, events_w = os.pipe()
    recorded_r, recorded_w = os.pipe()
    helper_r, helper_w = os.pipe()
    broker_r, broker_w = os.pipe()
    go_r, go_w = os.pipe()
    started = tmp_path / "started"

    def recorder():
        for fd in (events_w, recorded_r, helper_r, helper_w, broker_r, broker_w, go_r, go_w):
            os.close(fd)
        try:
            os.write(recorded_w, b"r")     # run.start is in the record (the real recorder's word)
        except BrokenPipeError:
            pass    # the run already ended (a refused stage): as the real recorder, go on
        os.close(recorded_w)
        with open(tmp_path / "events.jsonl", "wb") as out:
            while chunk := os.read(events_r, 65536):
                out.write(chunk)

    def helper():
        for fd in (events_r, events_w, recorded_r, recorded_w, helper_r, broker_r, broker_w, go_w):
            os.close(fd)
        _write_lines(helper_w, helper_before_go)
        if os.read(go_r, 1) == b"g":
            started.write_text("yes")
            _write_lines(helper_w, helper_after_go)

    def broker():
        for fd in (events_r, events_w, recorded_r, recorded_w, helper_r, helper_w, broker_r, go_r,
                   go_w):
            os.close(fd)
        _write_lines(broker_w, broker_lines)

    recorder_pid = _stand_in(recorder)
    helper_pid = _stand_in(helper)
    broker_pid = _stand_in(broker)
    for fd in (events_r, recorded_w, helper_w, broker_w, go_r):
        os.close(fd)
    emitter = Emitter(events_w, "r-test", path="office")
    said = []      # vpnw's own lines: the message is returned below
    run = RunWatch(StageLinks(helper_pid, broker_pid, recorder_pid, helper_r, broker_r, go_w,
                              recorded_r), emitter, said.append, "office")
    code, message = run.wait()
    os.close(events_w)
    run.reap()
    _, status = os.waitpid(recorder_pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    os.close(helper_r)
    os.close(broker_r)
    with open(tmp_path / "events.jsonl", "rb") as f:
        events = list(read_events(f))
    return code, message, events, started.exists()


READY = st.encode(st.Ready(("user", "net", "pid", "ipc", "mnt"), True, False,
                           (("http", 3128), ("socks", 1080))))
PATH_OK = st.encode(st.PathOk("office", "proxy", 3))
TOTALS = st.encode(st.Totals(connections=1))


def test_a_normal_run_gives_the_programs_code(tmp_path):
    code, message, events, started = scripted_run(
        [READY], [st.encode(st.Exited(3, None))], [PATH_OK, TOTALS], tmp_path)
    assert (code, message, started) == (3, None, True)
    assert [e["type"] for e in events] == ["sandbox.ready", "program.exit"]
    assert events[1]["fields"] == {"code": 3, "signal": None}


def test_a_program_killed_by_a_signal_gives_128_plus_n(tmp_path):
    code, _, _, _ = scripted_run([READY], [st.encode(st.Exited(137, 9))], [PATH_OK, TOTALS],
                                 tmp_path)
    assert code == 137


def test_a_denial_gives_120(tmp_path):
    code, _, _, _ = scripted_run([READY], [st.encode(st.Exited(0, None))],
                                 [PATH_OK, st.encode(st.Totals(connections=2, denied=1))], tmp_path)
    assert code == ExitCode.DENIED


def test_a_helper_failure_after_go_is_125_not_122(tmp_path):
    # The bug this module fixed: the helper's own failure ({"error", "code": 125})
    # was read as "the sandbox cannot be built" and reached the user as 122.
    failure = st.encode(st.SandboxFailed("the sandbox helper failed: OSError(9, 'Bad file descriptor')",
                                         ExitCode.INTERNAL))
    code, message, _, started = scripted_run([READY], [failure], [PATH_OK, TOTALS], tmp_path)
    assert started and code == ExitCode.INTERNAL, (code, message)
    assert "the sandbox helper failed" in message


def test_a_helper_failure_before_ready_is_125_and_nothing_starts(tmp_path):
    failure = st.encode(st.SandboxFailed("the sandbox helper failed: RuntimeError()",
                                         ExitCode.INTERNAL))
    code, message, _, started = scripted_run([failure], [], [PATH_OK, TOTALS], tmp_path)
    assert (code, started) == (ExitCode.INTERNAL, False), message


def test_a_sandbox_that_cannot_be_built_is_122(tmp_path):
    failure = st.encode(st.SandboxFailed("cannot create namespaces", ExitCode.NO_SANDBOX))
    code, message, _, started = scripted_run([failure], [], [PATH_OK, TOTALS], tmp_path)
    assert (code, message, started) == (ExitCode.NO_SANDBOX, "cannot create namespaces", False)


def test_a_program_not_found_is_127(tmp_path):
    failure = st.encode(st.ExecFailed("nope: not found", ExitCode.NOT_FOUND))
    code, message, _, started = scripted_run([READY], [failure], [PATH_OK, TOTALS], tmp_path)
    assert (code, message, started) == (ExitCode.NOT_FOUND, "nope: not found", True)


def test_a_path_down_is_123_and_nothing_starts(tmp_path):
    down = st.encode(st.PathDown("office", "127.0.0.1:9 refused"))
    code, message, _, started = scripted_run([READY], [], [down, TOTALS], tmp_path)
    assert (code, started) == (ExitCode.PATH_DOWN, False)
    assert "127.0.0.1:9 refused" in message


@pytest.mark.parametrize("junk", [
    b"not json",
    b'{"hello": "world"}',
    b'{"exit": {"code": 0, "signal": null}, "more": 1}',
    b'{"totals": {"connections": 0, "denied": 0, "would_deny": 0, "failed": 0}}',  # a broker kind
    st.encode(st.Exited(0, None)),                  # an exit before the program was let go
    READY,                                          # a second seal report
    st.encode(st.Stopped(20)),                      # a stop before the program was let go
])
def test_a_helper_saying_what_it_does_not_say_stops_the_run_before_the_program(junk, tmp_path):
    code, message, events, started = scripted_run([READY, junk], [], [PATH_OK, TOTALS], tmp_path)
    assert (code, started) == (ExitCode.INTERNAL, False), message
    assert "status message vpnw does not accept" in message


def test_a_helper_saying_junk_after_go_is_killed_and_the_run_is_125(tmp_path):
    # After its junk the stand-in would say a clean exit 0; it must not be believed.
    code, message, events, started = scripted_run(
        [READY], [b"{garbage", st.encode(st.Exited(0, None))], [PATH_OK, TOTALS], tmp_path)
    assert started and code == ExitCode.INTERNAL, message
    assert not [e for e in events if e["type"] == "program.exit"]


def test_a_broker_saying_junk_before_the_path_check_stops_the_run(tmp_path):
    code, message, _, started = scripted_run([READY], [], [b'{"path_ok": true}', TOTALS],
                                             tmp_path)
    assert (code, started) == (ExitCode.INTERNAL, False), message


READY_OWN_UNIX = st.encode(st.Ready(("user", "net", "pid", "ipc", "mnt"), True, False,
                                    (("http", 3128), ("socks", 1080)), unix="own"))
UNIX_DENIED = st.encode(st.UnixConnect(path="/run/docker.sock", allowed=False, process=7,
                                       program="curl", reason="a socket bound outside the sandbox"))


def test_the_supervisors_unix_reports_are_recorded_while_the_program_runs(tmp_path):
    """The phase table's running-phase rows (stages/orchestrator/phases.py):
    a Unix-socket report between go and the exit becomes unix.deny."""
    code, message, events, started = scripted_run(
        [READY_OWN_UNIX], [UNIX_DENIED, st.encode(st.Exited(0, None))], [PATH_OK, TOTALS], tmp_path)
    assert (code, message, started) == (0, None, True)
    assert [e["type"] for e in events] == ["sandbox.ready", "unix.deny", "program.exit"]
    assert events[1]["fields"] == {"path": "/run/docker.sock", "process": 7, "program": "curl",
                                   "reason": "a socket bound outside the sandbox"}


@pytest.mark.parametrize("ready, before_go, after_go, started_then", [
    (READY_OWN_UNIX, [UNIX_DENIED], [], False),        # before go: the program has not run
    (READY, [], [UNIX_DENIED], True),                  # a sandbox without the supervisor
])
def test_a_unix_report_out_of_its_phase_or_sandbox_stops_the_run(ready, before_go, after_go,
                                                                 started_then, tmp_path):
    code, message, events, started = scripted_run(
        [ready, *before_go], [*after_go, st.encode(st.Exited(0, None))], [PATH_OK, TOTALS],
        tmp_path)
    assert (code, started) == (ExitCode.INTERNAL, started_then), message
    assert "status message vpnw does not accept" in message
    assert "unix.deny" not in [e["type"] for e in events]


def test_exited_carries_the_no_route_count_only_when_there_is_one():
    assert st.encode(st.Exited(7, None, no_route=2)) == b'{"exit":{"code":7,"signal":null,"no_route":2}}\n'
    assert st.decode(st.encode(st.Exited(7, None, no_route=2)), st.HELPER_STATUS) == st.Exited(7, None, 2)
    assert st.decode(b'{"exit":{"code":7,"signal":null}}', st.HELPER_STATUS).no_route == 0
    with pytest.raises(st.StatusError):
        st.decode(b'{"exit":{"code":7,"signal":null,"no_route":-1}}', st.HELPER_STATUS)


def test_the_no_route_counters_are_read_from_the_kernels_tables():
    from stages.helper.network import no_routes
    snmp = ("Ip: Forwarding DefaultTTL OutRequests OutNoRoutes ReasmTimeout\n"
            "Ip: 2 64 0 3 0\nIcmp: InMsgs\nIcmp: 0\n")
    assert no_routes(snmp, "Ip6InReceives  4\nIp6OutNoRoutes                  \t2\n") == 5
    assert no_routes("", "") == 0

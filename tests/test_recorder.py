"""The recorder process: run file, replay, --record -, tee, a SIGKILL mid-stream."""
from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from stages.record.events import parse_line, read_events
from stages.recorder.main import main_from_fds
from stages.record.chain import verify
from stages.recorder.human import HumanState, format_event
from record_support import short_program_lines

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GOLDEN = os.path.join(HERE, "golden")
DEMO = os.path.join(GOLDEN, "demo_agent_trace.jsonl")
PY = sys.executable


def recorder(*args, stdin, env_extra=None, **kw):
    env = {**os.environ, "TZ": "UTC", "PYTHONPATH": ROOT}
    env.pop("NO_COLOR", None)
    env.update(env_extra or {})
    return subprocess.run([PY, "-m", "stages.recorder", *args], stdin=stdin, capture_output=True,
                          env=env, cwd=ROOT, timeout=60, **kw)


def as_recorded(data: bytes) -> list[dict]:
    """The events of a record, without the digest chain ("d")."""
    events = [json.loads(line) for line in data.splitlines()]
    for event in events:
        event.pop("d", None)
    return events


def demo_bytes() -> bytes:
    with open(DEMO, "rb") as f:
        return f.read()


def expected_lines(mode="trace", record=None) -> list[str]:
    state = HumanState(mode=mode, localtime=time.gmtime, record=record)
    with open(DEMO, "rb") as f:
        return [t for t in (format_event(e, state) for e in read_events(f)) if t is not None]


def test_replay_reproduces_the_human_lines():
    with open(DEMO, "rb") as f:
        done = recorder("--human", "trace", stdin=f)
    assert done.returncode == 0
    assert done.stdout == b""
    lines = done.stderr.decode().splitlines()
    # The summary ends with the run's last digest, as sealed by this recorder.
    summary, digest = lines[-1].rsplit("; last digest ", 1)
    assert re.fullmatch("[0-9a-f]{64}", digest)
    assert lines[:-1] + [summary] == expected_lines()
    assert lines[3] == "vpnw 11:44:36.071  #1   → api.github.com:443  http-connect"
    assert "\x1b[" not in done.stderr.decode()  # not a terminal: no colour


def test_run_mode_prints_the_problems_and_a_summary():
    with open(os.path.join(GOLDEN, "pip_guard.jsonl"), "rb") as f:
        done = recorder("--human", "run", stdin=f, env_extra={"HOME": "/root"})
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 3, lines
    assert "  #5     DENY   telemetry.example.net:443  no allow rule matches" in lines[0]
    assert "  #6     FAIL   pypi.org:443  151.101.0.223:443 did not answer" in lines[1]
    assert re.fullmatch(r"vpnw  run r-7c01d2: 6 connections, 1 denied, 1 failed; exit 120; "
                        r"record ~/\.local/state/vpnw/runs/r-7c01d2\.jsonl; last digest [0-9a-f]{64}",
                        lines[2]), lines[2]


def test_record_file_is_the_stream_and_private(tmp_path):
    record = tmp_path / "run.jsonl"
    with open(DEMO, "rb") as f:
        done = recorder("--record", str(record), "--human", "quiet", stdin=f)
    assert done.returncode == 0 and done.stderr == b""
    assert as_recorded(record.read_bytes()) == as_recorded(demo_bytes())
    assert verify(record.read_bytes().splitlines(keepends=True)).status == "whole"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    # A chained record replayed through the recorder comes out byte for byte.
    again = tmp_path / "again.jsonl"
    with open(record, "rb") as f:
        done = recorder("--record", str(again), "--human", "quiet", stdin=f)
    assert done.returncode == 0 and again.read_bytes() == record.read_bytes()


def test_no_directory_is_created_for_a_record(tmp_path):
    record = tmp_path / "deep" / "er" / "run.jsonl"
    with open(DEMO, "rb") as f:
        done = recorder("--record", str(record), "--human", "quiet", stdin=f)
    assert done.returncode == 1
    assert f"the directory {record.parent} does not exist".encode() in done.stderr
    assert not (tmp_path / "deep").exists()


def test_record_to_stdout():
    with open(DEMO, "rb") as f:
        done = recorder("--record", "-", "--human", "quiet", stdin=f)
    assert done.returncode == 0
    assert as_recorded(done.stdout) == as_recorded(demo_bytes())
    assert verify(done.stdout.splitlines(keepends=True)).status == "whole"


def test_tee_to_an_external_program(tmp_path):
    teed = tmp_path / "teed.jsonl"
    record = tmp_path / "run.jsonl"
    with open(DEMO, "rb") as f:
        done = recorder("--record", str(record), "--human", "quiet",
                        "--events-to", f"cat > '{teed}'", stdin=f)
    assert done.returncode == 0, done.stderr
    # The copy is the record, byte for byte; run.end says the copy lost nothing.
    assert teed.read_bytes() == record.read_bytes()
    events = as_recorded(record.read_bytes())
    assert events[-1]["fields"].pop("events_to_lost") == 0
    assert events == as_recorded(demo_bytes())
    # The same through tee(1), whose stdout is the recorder's.
    with open(DEMO, "rb") as f:
        done = recorder("--human", "quiet", "--events-to", f"tee '{tmp_path / 't2'}'", stdin=f)
    assert (tmp_path / "t2").read_bytes() == record.read_bytes()
    assert done.stdout == record.read_bytes()


def test_run_end_counts_every_earlier_event_lost_when_they_arrive_together(tmp_path):
    # The whole run in one read: run.end's losses are counted once every
    # event before it has been offered to the copies (it was counted before
    # they were, and a copy that lost everything said it lost nothing).
    import socket
    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    record = tmp_path / "run.jsonl"
    with open(DEMO, "rb") as f:
        done = recorder("--record", str(record), "--human", "quiet",
                        "--syslog", f"tcp://127.0.0.1:{dead}", stdin=f)
    assert done.returncode == 0, done.stderr
    events = as_recorded(record.read_bytes())
    assert events[-1]["type"] == "run.end"
    assert events[-1]["fields"]["syslog_lost"] == len(events) - 1, events[-1]


def test_a_tee_that_dies_does_not_stop_the_record(tmp_path):
    # More than a pipe buffer of events, so the dead reader is noticed for sure.
    data = demo_bytes() * 400
    src = tmp_path / "many.jsonl"
    src.write_bytes(data)
    record = tmp_path / "run.jsonl"
    with open(src, "rb") as f:
        done = recorder("--record", str(record), "--human", "quiet", "--events-to", "exit 0",
                        stdin=f)
    assert done.returncode == 0
    events = as_recorded(record.read_bytes())
    lost = []     # (how many the copy lost by then, how many events came before)
    for n, event in enumerate(events):
        if event["type"] == "run.end":
            lost.append((event["fields"].pop("events_to_lost"), n))
    # The reader died at once: the copy loses events from early on, ever more,
    # never more than there were.
    counts = [count for count, _ in lost]
    assert counts == sorted(counts) and counts[-1] > 0, counts
    assert all(count <= before + 1 for count, before in lost), lost
    assert events == as_recorded(data)
    messages = done.stderr.decode().splitlines()
    assert len(messages) == 1 and "stopped reading" in messages[0] and "still recorded" in messages[0]


def test_sigkill_mid_stream_leaves_only_whole_lines(tmp_path):
    record = tmp_path / "run.jsonl"
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([PY, "-m", "stages.recorder", "--record", str(record), "--human", "quiet"],
                            stdin=subprocess.PIPE, env=env, cwd=ROOT)
    chunk = demo_bytes()

    def feed():
        try:
            for _ in range(100_000):
                proc.stdin.write(chunk)
        except (BrokenPipeError, ValueError, OSError):
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    deadline = time.monotonic() + 30
    while (not record.exists() or record.stat().st_size < 2_000_000) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    feeder.join(timeout=30)
    data = record.read_bytes()
    assert len(data) >= 2_000_000
    whole, _, tail = data.rpartition(b"\n")
    for line in whole.splitlines():
        parse_line(line)
    # One write(2) per line; still, the kernel may stop a write killed by
    # SIGKILL between two pages, so the very last line can be cut short. It is
    # the only one, and readers skip it (docs/record.md).
    assert len(tail) < len(chunk)
    with record.open("rb") as f:
        assert sum(1 for _ in read_events(f)) == whole.count(b"\n") + 1


def _in_process(tmp_path, data: bytes, **kw) -> int:
    src = tmp_path / "in.jsonl"
    src.write_bytes(data)
    fd = os.open(src, os.O_RDONLY)
    try:
        return main_from_fds(fd, **kw)
    finally:
        os.close(fd)


def test_lines_that_are_not_events_are_not_recorded(tmp_path, capfd):
    good = demo_bytes().splitlines(keepends=True)
    data = good[0] + b"not json\n" + b'{"v":2,"type":"run.start"}\n' + b"".join(good[1:]) + b'{"v":1,"ts'
    record = tmp_path / "run.jsonl"
    assert _in_process(tmp_path, data, record=str(record), human="quiet") == 0
    assert as_recorded(record.read_bytes()) == as_recorded(demo_bytes())
    err = capfd.readouterr().err
    assert "skipping a line that is not a version-1 event" in err
    assert "3 lines were not version-1 events" in err


def test_a_last_line_without_newline_is_kept(tmp_path):
    record = tmp_path / "run.jsonl"
    assert _in_process(tmp_path, demo_bytes().rstrip(b"\n"), record=str(record), human="quiet") == 0
    assert as_recorded(record.read_bytes()) == as_recorded(demo_bytes())


def test_an_unwritable_record_is_an_error(tmp_path, capfd):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert _in_process(tmp_path, demo_bytes(), record=str(blocker / "run.jsonl"), human="quiet") == 1
    assert "cannot write the record" in capfd.readouterr().err


def test_unknown_human_mode_is_refused(tmp_path):
    with pytest.raises(ValueError):
        _in_process(tmp_path, b"", record=None, human="loud")


@pytest.mark.parametrize("case", ["whole", "cut", "later event"])
def test_the_live_trace_prints_a_short_program_in_the_order_things_happened(tmp_path, case):
    # issue 28: live, the trace printed "program exited" above the connection's
    # close line (arrival order); it now prints what `vpnw show` prints.
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(short_program_lines(cut=case == "cut", late_after=case == "later event")))
    with open(src, "rb") as f:
        done = recorder("--human", "trace", stdin=f)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.decode().splitlines()
    steps = [("program" if "program exited" in line else "#1" if "  #1 " in line
              else "#2" if "  #2 " in line else "run.end" if "0 connections" in line or
              "1 connections" in line else None) for line in lines]
    steps = [s for s in steps if s]
    expected = {"whole": ["#1", "#1", "#1", "program", "run.end"],
                "cut": ["#1", "#1", "#1", "program"],
                "later event": ["#1", "#1", "#1", "program", "#2", "run.end"]}[case]
    assert steps == expected, lines


# --- vpnw watch's view (issue 44), the pure part -------------------------------------

def test_the_watch_view_counts_per_destination_and_keeps_the_last_reason():
    from stages.record.events import encode, parse_line
    from stages.recorder.watch import WatchState, frame
    t = [1_790_682_276_000_000_000]

    def ev(type_, conn=None, **fields):
        t[0] += 1_000_000
        return parse_line(encode("r-watch1", type_, fields, path="direct", conn=conn, pid=1, ts_ns=t[0]))
    state = WatchState()
    events = [ev("run.start", mode="trace", program="agent", policy=None, policy_file=None, via="direct",
                 dry_run=False, allow_unix_sockets=False, version="0.1.0", record="-"),
              ev("conn.request", 1, door="http", kind="http-connect", host="api.github.com", port=443),
              ev("conn.open", 1, address="140.82.112.6", port=443, via="direct", ms=1),
              ev("conn.request", 2, door="socks", kind="socks5", host="169.254.169.254", port=80),
              ev("policy.deny", 2, rule="machine", reason="the metadata address", enforced=True,
                 host="169.254.169.254", port=80, door="socks")]
    for event in events:
        state.feed(event)
    lines = frame(state, width=120, height=20)
    assert "running" in lines[0] and lines[1].startswith("1 allowed, 1 denied, 0 failed; 2 destinations")
    rows = {line.split()[0]: line.split() for line in lines[4:] if line and not line.startswith("last")}
    assert rows["api.github.com:443"][1:5] == ["1", "0", "0", "1"] and rows["api.github.com:443"][-1] == "open"
    assert rows["169.254.169.254:80"][1:5] == ["0", "1", "0", "0"]
    assert lines[-1] == "last: 169.254.169.254:80 denied: the metadata address"
    state.feed(ev("conn.close", 1, bytes_up=1200, bytes_down=3400000, ms=5))
    state.feed(ev("run.end", exit_code=120, connections=2, denied=1, failed=0))
    lines = frame(state, width=120, height=4)
    assert "ended, exit 120" in lines[0] and lines[-1] == "... and 2 more" and len(lines) == 5

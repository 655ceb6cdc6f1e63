"""`vpnw runs`, `vpnw show` and "the last trace" (stages/record/runs.py)."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from stages.record.destinations import destinations
from stages.record.events import read_events
from stages.record import runs
from stages.recorder.commands import runs_command, show_command
from record_support import short_program_lines

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


@pytest.fixture
def state(tmp_path):
    """A runs directory holding the three golden runs under their ids."""
    directory = tmp_path / "runs"
    directory.mkdir()
    for name, run_id in (("demo_agent_trace", "r-36e0ba"), ("pip_guard", "r-7c01d2"),
                         ("dry_run_guard", "r-d2a9f0")):
        shutil.copy(os.path.join(GOLDEN, name + ".jsonl"), directory / f"{run_id}.jsonl")
    return directory


def test_list_runs_newest_first(state):
    summaries = runs.list_runs(str(state))
    assert [s.id for s in summaries] == ["r-d2a9f0", "r-7c01d2", "r-36e0ba"]
    pip = summaries[1]
    assert (pip.program, pip.mode, pip.connections, pip.denied, pip.failed, pip.exit_code,
            pip.complete) == ("pip", "guard", 6, 1, 1, 120, True)
    assert pip.start == "2026-09-29T12:44:36.000000000Z"


def test_a_killed_run_is_counted_by_streaming(state):
    lines = (state / "r-7c01d2.jsonl").read_bytes().splitlines(keepends=True)
    (state / "r-7c01d2.jsonl").write_bytes(b"".join(lines[:-2]) + lines[-2][:25])  # torn tail
    pip = next(s for s in runs.list_runs(str(state)) if s.id == "r-7c01d2")
    assert (pip.connections, pip.denied, pip.failed, pip.exit_code, pip.complete) == (6, 1, 1, None, False)


def test_last_run_and_last_trace(state):
    assert runs.last_run(str(state)) == str(state / "r-d2a9f0.jsonl")
    assert runs.last_run(str(state), mode="trace") == str(state / "r-36e0ba.jsonl")
    assert runs.last_run(str(state), mode="run") is None
    assert runs.last_run(str(state / "missing")) is None


def test_last_run_ties_go_to_the_newer_file(state):
    # Two runs started in the same nanosecond: the newer mtime wins.
    twin = state / "r-000000.jsonl"
    twin.write_bytes((state / "r-36e0ba.jsonl").read_bytes().replace(b"r-36e0ba", b"r-000000"))
    os.utime(state / "r-36e0ba.jsonl", ns=(1, 1))
    os.utime(twin, ns=(2, 2))
    assert runs.last_run(str(state), mode="trace") == str(twin)
    os.utime(twin, ns=(0, 0))
    assert runs.last_run(str(state), mode="trace") == str(state / "r-36e0ba.jsonl")


def test_a_file_without_run_start_is_never_the_last_trace(state):
    (state / "junk.jsonl").write_text("not an event\n")
    assert runs.last_run(str(state), mode="trace") == str(state / "r-36e0ba.jsonl")
    assert any(s.id == "junk" for s in runs.list_runs(str(state)))


def test_resolve_run(state):
    d = str(state)
    assert runs.resolve_run("r-7c01d2", d) == os.path.join(d, "r-7c01d2.jsonl")
    assert runs.resolve_run("7c01d2", d) == os.path.join(d, "r-7c01d2.jsonl")
    assert runs.resolve_run(None, d) == os.path.join(d, "r-d2a9f0.jsonl")
    path = os.path.join(GOLDEN, "pip_guard.jsonl")
    assert runs.resolve_run(path, d) == path
    with pytest.raises(runs.RunNotFound):
        runs.resolve_run("r-nothere", d)


def test_destinations(state):
    with open(state / "r-7c01d2.jsonl", "rb") as f:
        table = destinations(read_events(f))
    assert [(d.host, d.port, d.decision, d.requests, d.bytes_up, d.bytes_down) for d in table] == [
        ("files.pythonhosted.org", 443, "allowed", 3, 4200, 3_029_000),
        ("pypi.org", 443, "allowed/failed", 2, 1900, 120_000),
        ("telemetry.example.net", 443, "denied", 1, 0, 0),
    ]


def test_runs_command(state):
    result = CliRunner().invoke(runs_command, ["--dir", str(state)])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].split() == ["RUN", "START", "(UTC)", "MODE", "PROGRAM", "CONNS", "DENIED",
                                "FAILED", "EXIT", "HELD", "LEDGER"]
    # No ledger beside this directory: "-" (tests/test_e2e_signed_end.py has the rest).
    assert lines[2].split() == ["r-7c01d2", "2026-09-29", "12:44:36Z", "guard", "pip", "6", "1", "1", "120",
                                "-", "-"]
    result = CliRunner().invoke(runs_command, ["--dir", str(state), "--json"])
    data = json.loads(result.output)
    assert [d["id"] for d in data] == ["r-d2a9f0", "r-7c01d2", "r-36e0ba"]


def test_runs_command_reads_the_state_directory(state, tmp_path, monkeypatch):
    shutil.copytree(state, tmp_path / "xdg" / "vpnw" / "runs")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    result = CliRunner().invoke(runs_command, ["--json"])
    assert len(json.loads(result.output)) == 3


def test_show_human_summary_and_json(state, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    import time
    time.tzset()
    try:
        result = CliRunner().invoke(show_command, ["r-7c01d2", "--dir", str(state)])
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert result.exit_code == 0
    assert "vpnw 12:44:36.000  run r-7c01d2: guard pip  (via direct, policy pip)" in result.output
    assert "#5     DENY   telemetry.example.net:443" in result.output

    result = CliRunner().invoke(show_command, ["7c01d2", "--summary", "--dir", str(state)])
    assert result.output.splitlines() == [
        "HOST                    PORT  DECISION        CONNS      UP      DOWN",
        "files.pythonhosted.org   443  allowed             3  4.2 kB    3.0 MB",
        "pypi.org                 443  allowed/failed      2  1.9 kB  120.0 kB",
        "telemetry.example.net    443  denied              1     0 B       0 B",
    ]
    result = CliRunner().invoke(show_command, ["--json", "--dir", str(state)])
    data = json.loads(result.output)
    assert data["run"]["id"] == "r-d2a9f0"
    assert [d["decision"] for d in data["destinations"]] == ["would deny", "allowed"]


def test_show_an_unknown_run(state):
    result = CliRunner().invoke(show_command, ["r-nope", "--dir", str(state)])
    assert result.exit_code == 121
    assert "no run 'r-nope'" in result.output


def test_show_puts_the_events_back_in_the_order_they_happened(tmp_path):
    # issue 28: a short program's program.exit reaches the recorder (and the
    # file) before the broker's last conn.close, whose ts is earlier.
    lines = short_program_lines()
    path = tmp_path / "r-0dde40.jsonl"
    path.write_bytes(b"".join(lines))
    shown = CliRunner().invoke(show_command, [str(path)]).output.splitlines()
    steps = ["program" if "program exited" in line else "conn" for line in shown
             if "program exited" in line or "  #1 " in line]
    assert steps == ["conn", "conn", "conn", "program"], shown
    assert "run r-0dde40" in shown[-1], shown
    # The reordering streams: a window of lines, never the whole file.
    events = [{"ts": f"{n:04d}", "n": n} for n in (3, 1, 2, 6, 5, 4)]
    assert [e["n"] for e in runs.in_time_order(events, window=2)] == [1, 2, 3, 4, 5, 6]
    assert [e["n"] for e in runs.in_time_order(events, window=1)] == [1, 2, 3, 5, 4, 6]   # 4 is 2 lines late


def test_a_cut_run_whose_pid_a_later_vpnw_holds_is_not_running(tmp_path):
    """`running` (and `show --verify`'s 124) only while the vpnw that wrote
    run.start lives: a process given its number later, even a vpnw, is not
    it, so a cut record never passes for a run still going."""
    import subprocess
    import sys
    import time
    from stages.record.events import rfc3339_ns
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "vpnw"])
    try:
        time.sleep(0.1)
        def cut_run(ts: str) -> str:
            path = tmp_path / f"r-{len(os.listdir(tmp_path))}.jsonl"
            path.write_text(json.dumps({"v": 1, "ts": ts, "type": "run.start", "run": "r-1",
                                        "pid": other.pid, "path": "direct", "conn": None,
                                        "fields": {"mode": "run", "program": "x"}}) + "\n")
            return str(path)
        before = cut_run("2020-01-01T00:00:00.000000000Z")      # the pid was given again since
        assert runs.summarize(before).state == "cut"
        assert not runs.still_running(before)
        after = cut_run(rfc3339_ns(time.time_ns()))               # its writer, as far as can be told
        assert runs.summarize(after).state == "running"
        assert runs.still_running(after)
    finally:
        other.kill()
        other.wait()

"""The start-up trace (stages/startup/trace.py): off, it writes nothing;
on, every process of a run marks its steps in one file, and the marks show
the order the seal demands (docs/architecture.md, "Start-up budget"): the
program is let go only after the seal is reported ready, the path is
checked and run.start is in the record, and it execs only after that."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from progs_support import prog_text
from stages.startup import trace as startup_trace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

FORKED_MARKS = prog_text("forked_marks.py")


def _run_marks(tmp_path, value):
    env = {k: v for k, v in os.environ.items() if k != startup_trace.VARIABLE}
    if value is not None:
        env[startup_trace.VARIABLE] = value
    # Run in tmp_path, with the checkout on the path: a relative trace file would land there.
    env["PYTHONPATH"] = ROOT
    subprocess.run([sys.executable, "-c", FORKED_MARKS], check=True, cwd=tmp_path, env=env)


def read_marks(path) -> list[tuple[int, int, str, str]]:
    """The marks, each process's CPU checked: it never goes back."""
    out, cpu_of = [], {}
    for line in open(path).read().splitlines():
        ns, pid, cpu_us, stage, what = line.split(" ", 4)
        assert int(cpu_us) >= cpu_of.get((pid, stage), 0), line
        cpu_of[(pid, stage)] = int(cpu_us)
        out.append((int(ns), int(pid), stage, what))
    return out


BURN_MS = 50
CPU_MARKS = prog_text("cpu_marks.py")


def test_the_cpu_field_is_the_process_own_cpu_time(tmp_path):
    """`<CPU us>` is what the marking process itself has spent: a burn of
    BURN_MS of CPU shows in the burner's next mark, a child's burn does not
    show in its parent's, and a forked child counts from its fork."""
    trace = tmp_path / "trace"
    env = {**os.environ, startup_trace.VARIABLE: str(trace), "PYTHONPATH": ROOT}
    subprocess.run([sys.executable, "-c", CPU_MARKS, str(BURN_MS)], check=True, cwd=tmp_path, env=env, timeout=60)
    cpu = {what: int(cpu_us) for _ns, _pid, cpu_us, _stage, what in
           (line.split(" ", 4) for line in trace.read_text().splitlines())}
    burn_us = BURN_MS * 1000
    assert cpu["child, after its burn"] >= burn_us, cpu
    assert cpu["parent, after its own burn"] - cpu["parent, after the child's burn"] >= burn_us, cpu
    # The parent's CPU while its child burnt is its fork and wait, not the burn.
    assert cpu["parent, after the child's burn"] - cpu["parent"] < burn_us, cpu
    # The child's clock started over at its fork: the interpreter's start-up,
    # in the parent's first mark, is not in the child's.
    assert cpu["parent"] > 0 and cpu["child, after its burn"] < cpu["parent"] + burn_us, cpu


@pytest.mark.parametrize("value", [None, ""])
def test_off_writes_nothing(tmp_path, value):
    _run_marks(tmp_path, value)
    assert os.listdir(tmp_path) == []


def test_on_each_process_appends_its_marks(tmp_path):
    trace = tmp_path / "trace"
    _run_marks(tmp_path, str(trace))
    marks = read_marks(trace)
    assert [(stage, what) for _ns, _pid, stage, what in marks] == [
        ("vpnw", "parent"), ("helper", "child with spaces in what"), ("vpnw", "parent again")]
    assert marks[0][1] == marks[2][1] != marks[1][1]           # the child's own pid
    assert marks[0][0] <= marks[1][0] <= marks[2][0]           # one clock for all


def test_a_trace_that_cannot_be_written_changes_nothing(tmp_path):
    _run_marks(tmp_path, str(tmp_path / "no such directory" / "trace"))   # exits 0


@pytest.mark.world
@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
def test_a_traced_run_marks_every_process_in_the_seal_order(world, user, capture):
    work = world.workdir(user)
    trace = work / "trace"
    result = world.vpnw(["run", *(["--capture"] if capture else []), "--record", str(work / "run.jsonl"),
                         "--", "true"], user=user, env={startup_trace.VARIABLE: str(trace)})
    assert result.returncode == 0, result.stderr
    marks = read_marks(trace)
    at = {}
    for ns, _pid, stage, what in marks:
        at.setdefault(f"{stage}: {what}", ns)
    assert {stage for _ns, _pid, stage, _what in marks} == {
        "vpnw", "recorder", "broker", "helper", "init", "program"}
    go = at["vpnw: go"]
    for before_go in ("vpnw: helper: Ready", "vpnw: broker: PathOk", "vpnw: run.start recorded",
                      "helper: network sealed", "init: protected paths bound read-only",
                      "recorder: run.start written"):
        assert at[before_go] <= go, before_go
    # The helper is forked first, before the policy loads, and makes its
    # namespaces only once it has the plan vpnw sends after loading it.
    assert at["vpnw: command line parsed"] <= at["vpnw: helper forked"] \
        <= at["vpnw: policy and paths loaded"] <= at["vpnw: plan sent"]
    assert at["helper: seccomp filter built"] <= at["helper: waiting for the plan"] \
        <= at["helper: plan read"] <= at["helper: namespaces made"]
    assert at["vpnw: plan sent"] <= at["helper: plan read"]
    # The program's process is sealed before go (while Ready is answered)
    # and execs only after it.
    assert at["init: protected paths bound read-only"] <= at["program: sealed"] <= at["program: go, exec"]
    assert go <= at["helper: go"] and go <= at["program: go, exec"]     # each reads its byte of go
    assert at["program: go, exec"] <= at["init: program reaped"] <= at["vpnw: run.end sent"]
    assert at["vpnw: run.end sent"] <= at["recorder: signed"] <= at["vpnw: recorder reaped"]
    # The broker's loop loads once the doors came (after init's binds), not
    # while the helper seals; a run whose doors and end came together skips it.
    if "broker: loop import begun" in at:
        assert at["init: protected paths bound read-only"] <= at["broker: loop import begun"]
    if "broker: loop loaded" in at:
        assert at["broker: loop import begun"] <= at["broker: loop loaded"]

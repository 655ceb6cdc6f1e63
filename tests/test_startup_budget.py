"""The start-up budget (docs/architecture.md, "Start-up budget";
stages/startup/tricks.py): how many modules each step on the way to the
program has loaded, against a stated budget, with the start-up tricks on;
and the same steps with VPNW_STARTUP_TRICKS=off loading more, so the count
shows what the tricks keep out (and that the switch turns them off).

No clock: a module count does not vary with the machine's load, and every
module loaded on the way to the seal costs CPU the program waits for. The
steps: vpnw's modules when it forks the helper (every module the helper
starts with) and when it forks the recorder (vpnw's part of the critical
path), and the broker's loop as it loads before the first connection.
Each budget is today's count plus a few modules of room; a change that
needs more says so here, with what it bought.

Also: the table of tricks (stages/startup/tricks.py) and the one in
docs/architecture.md say the same, and each trick kept buys 1 ms or more."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from e2e_support import audited_run
from progs_support import prog_text
from startup_support import AT_THE_FORKS, ROOT, modules_loaded
from stages.startup import VARIABLE
from stages.startup.tricks import DROPPED, TRICKS

THE_LOOP = prog_text("the_broker_loop_loaded.py")

# (step, budget with the tricks on). Counted when this was written: 66, 109 and 154
# (with the tricks off: 121, 155 and 192); then the house's splits (issue 46)
# made the same code more modules: the run's parts (run_request, own_lines,
# protection, run_start, run_held, stage_forks, phases, stage_reports, watch),
# the policy's rule index, the event types, the C halves: 70, 122 and 165.
BUDGETS = {"vpnw at the helper's fork": 72, "vpnw at the recorder's fork": 125,
           "the broker's loop loaded": 170}


def _steps(tricks: str, tmp_path) -> dict[str, set[str]]:
    helper, recorder = modules_loaded(AT_THE_FORKS, tricks, tmp_path)
    (loop,) = modules_loaded(THE_LOOP, tricks, tmp_path)
    return {"vpnw at the helper's fork": helper, "vpnw at the recorder's fork": recorder,
            "the broker's loop loaded": loop}


def test_each_step_of_the_start_loads_within_its_budget_and_fewer_than_with_the_tricks_off(tmp_path):
    """With the tricks on each step has loaded no more modules than its
    budget; with them off (the same steps, VPNW_STARTUP_TRICKS=off) each
    loads more, among them what the tricks keep out: click (quick_parse),
    typing (records), inspect (records, orjson's stand-ins), ssl (the loop
    without it)."""
    on, off = _steps("on", tmp_path), _steps("off", tmp_path)
    for step, budget in BUDGETS.items():
        assert "stages.orchestrator.options" in on[step] or step.startswith("the broker")   # control
        assert len(on[step]) <= budget, (step, len(on[step]), sorted(on[step]))
        assert len(off[step]) > len(on[step]), step
    assert not {"click", "typing", "inspect"} & on["vpnw at the recorder's fork"]
    assert {"click", "typing", "inspect"} <= off["vpnw at the recorder's fork"]
    assert "ssl" not in on["the broker's loop loaded"] and "ssl" in off["the broker's loop loaded"]


def _docs_table() -> dict[str, float]:
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    section = text[text.index("## Start-up budget"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    rows = re.findall(r"^\| (.+?) \| .*? \| ([0-9.]+) \|$", section, re.M)
    return {name: float(gain) for name, gain in rows}


def test_the_docs_table_is_the_code_table():
    """docs/architecture.md lists every trick (kept and dropped) with its
    gain, as stages/startup/tricks.py does."""
    assert _docs_table() == {t.name: t.gain_ms for t in TRICKS + DROPPED}


def test_each_trick_kept_buys_a_millisecond():
    assert all(t.gain_ms >= 1.0 for t in TRICKS), [t.name for t in TRICKS if t.gain_ms < 1.0]
    assert all(t.gain_ms < 1.0 for t in DROPPED)
    names = [t.name for t in TRICKS + DROPPED]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("tricks", ["on", "off"])
def test_the_switch_is_read_from_the_environment(tricks, tmp_path):
    """stages.startup.ON follows VPNW_STARTUP_TRICKS (only "off" turns it off)."""
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n"
                          "import stages.startup as s; print(s.ON)"],
                         env={**os.environ, VARIABLE: tricks}, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == str(tricks == "on")


@pytest.mark.world
def test_the_switch_reaches_every_process_and_the_program_sees_the_persons_environment(world, user):
    """A real run with VPNW_STARTUP_TRICKS=off and one with it on, every
    import of every process seen: off, the helper loads the json package
    (the status lines' codec, stages/startup/json_c.py), the recorder
    hashlib (stages/record/digests.py) and the broker ssl's `_ssl` (a plain `import
    asyncio`); on, none of them does (the controls: `_json`, `_sha256`, and
    the broker's asyncio). The program's environment has the variable as
    the person set it, either way."""
    work = world.workdir(user)
    seen = {}
    for tricks in ("off", "on"):
        shown = work / f"env-{tricks}"
        program = ["sh", "-c", f'echo "${{{VARIABLE}-unset}}" > {shown}; sleep 0.5']
        at, imported = audited_run(world, user, work, ["run", "--record", str(work / f"{tricks}.jsonl"),
                                                      "--", *program],
                                   tag=tricks, env={VARIABLE: tricks})
        pids = {"helper": at[("helper", "Ready sent")][1],
                "recorder": at[("recorder", "run.start written")][1],
                "broker": at[("broker", "path reported")][1]}
        seen[tricks] = {stage: {name for _ns, pid, name in imported if pid == p}
                        for stage, p in pids.items()}
        assert shown.read_text().strip() == tricks
    off, on = seen["off"], seen["on"]
    assert "json" in off["helper"] and "json" not in on["helper"]
    assert "_json" in on["helper"]                                          # control
    assert "hashlib" in off["recorder"] and "hashlib" not in on["recorder"]
    assert "_sha256" in on["recorder"] or "_sha2" in on["recorder"]         # control
    assert "_ssl" in off["broker"] and "_ssl" not in on["broker"]
    assert "asyncio" in on["broker"]                                        # control

"""The run's request (stages/orchestrator/run_request.py): the command line's
options as one typed record, then the plan they load to, typed; and vpnw's
own lines (own_lines.py), handed to the run's parts instead of living in a
module's state."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from stages.orchestrator import options as opt
from stages.orchestrator.own_lines import OwnLines
from stages.orchestrator.run_request import RunOptions, RunPlan, RunRequest

ORCHESTRATOR = Path(__file__).resolve().parent.parent / "stages" / "orchestrator"
# The run's own modules (the command line's checks, the run and its parts).
RUN_MODULES = ("run_command", "run", "run_request", "own_lines", "protection", "run_start",
               "run_held", "stage_forks", "phases", "stage_reports", "watch", "outcome")


@pytest.mark.parametrize("mode", opt.SANDBOXED)
def test_every_option_click_or_the_quick_parser_gives_is_a_field_with_its_default(mode):
    """What quick_parse hands run_command.execute (click hands the same,
    tests/test_quick_parse.py) makes a RunOptions as it is, field by field."""
    parsed = opt.quick_parse(mode, ["--", "true"] if mode != "guard" else
                             ["--policy", "p.toml", "--", "true"])
    made = RunOptions(mode=mode, **parsed)
    assert {name: getattr(made, name) for name in parsed} == parsed
    assert set(RunOptions._fields) == {"mode", "program"} | {o.dest for o in opt.OPTIONS}
    defaults = RunOptions(mode=mode, program=("true",))
    assert all(getattr(defaults, o.dest) == o.default for o in opt.options_of(mode))


def test_an_option_the_request_does_not_know_is_refused():
    with pytest.raises(TypeError, match="no field|unexpected keyword"):     # a record; a dataclass with the tricks off
        RunOptions(mode="run", program=("true",), polcy_file="p.toml")


def test_the_request_and_its_plan_are_typed_never_object():
    for record in (RunOptions, RunPlan, RunRequest):
        hints = record.__annotations__
        assert "object" not in hints.values(), (record.__name__, hints)
    assert {"policy", "path", "files", "config_files", "secrets"} <= set(RunPlan._fields)


def test_no_run_module_reads_a_field_with_getattr_and_a_default():
    """The request's fields are there to be read (no getattr(x, name, default)),
    and no module keeps the run's state at module level."""
    found = []
    for name in RUN_MODULES:
        tree = ast.parse((ORCHESTRATOR / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "getattr" \
                    and len(node.args) == 3:
                found.append(f"{name}.py:{node.lineno}")
            if isinstance(node, ast.Global):
                found.append(f"{name}.py:{node.lineno} global {', '.join(node.names)}")
    assert found == []


def test_own_lines_go_to_stderr_then_through_the_relay_while_it_runs(capsys):
    say, relayed = OwnLines(), []
    say("before the relay")
    say.relay_say = relayed.append
    say("while it runs")
    say.relay_say = None
    say("after it")
    assert capsys.readouterr().err == "vpnw: before the relay\nvpnw: after it\n"
    assert relayed == ["vpnw: while it runs"]

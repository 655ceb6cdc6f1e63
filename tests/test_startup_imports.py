"""What a run's processes import on the way to the program (docs/architecture.md,
"Start-up budget"): modules only a rare path needs stay out of the start.
Each check imports, in a fresh interpreter, what vpnw and its stages load
for that step and lists what came in."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from e2e_support import audited_run
from progs_support import prog_text
from stages import startup
from startup_support import AT_THE_FORKS, modules_loaded, needs_the_tricks


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _modules_after(code: str, tmp_path, *args: str) -> set[str]:
    """The names in sys.modules once `code` (a line, or a program of
    tests/progs) has run with `args` in a fresh interpreter with the
    checkout on its path."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\n"
                          "print(json.dumps(sorted(sys.modules)))", *args],
                         check=True, cwd=tmp_path, env=env, capture_output=True, text=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


SIGNED_RUN_WITH_POLICY = prog_text("signed_run_with_policy.py")


@needs_the_tricks
def test_a_signed_run_with_a_policy_loads_no_openssl_digest(tmp_path):
    """vpnw (the policy's digest), the recorder (the digest chain) and the
    signing (BLAKE2b of the file) take their digests from CPython's own
    modules: `_hashlib` would load libcrypto, ~3 ms of CPU at the start."""
    policy = tmp_path / "p.toml"
    policy.write_text('version = 1\n[policy]\nallow = ["example.com"]\n')
    record = tmp_path / "r.jsonl"
    record.write_text('{"type":"run.start"}\n')
    loaded = _modules_after(SIGNED_RUN_WITH_POLICY, tmp_path, str(policy), str(record))
    assert "stages.record.digests" in loaded       # control: the code under test ran
    assert "_hashlib" not in loaded


def test_the_digests_are_hashlibs():
    from stages.record.digests import blake2b, sha256
    for data in (b"", b"abc", b'{"type":"run.start"}\n' * 1000):
        assert sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()
        assert blake2b(data).digest() == hashlib.blake2b(data).digest()


RUN_WITHOUT_POLICY_UNTIL_THE_FORK = prog_text("run_without_policy_until_the_fork.py")


def test_a_run_without_a_policy_parses_no_address_before_its_stages(tmp_path):
    """No --policy, no --config: vpnw has no rule or proxy address to parse
    before it forks, so ipaddress (and the special-purpose table) load only
    in the broker, which judges addresses."""
    loaded = _modules_after(RUN_WITHOUT_POLICY_UNTIL_THE_FORK, tmp_path)
    assert "stages.config.policy" in loaded and "stages.config.paths" in loaded   # control
    assert not {"ipaddress", "stages.config.addresses"} & loaded


def test_a_policy_still_parses_address_rules():
    from stages.config.host_rules import parse_rule
    assert str(parse_rule("::ffff:203.0.113.0/120").network) == "203.0.113.0/24"
    assert str(parse_rule("[2001:db8::1]:443").network) == "2001:db8::1/128"


def test_the_recorder_starts_without_calendar(tmp_path):
    """calendar serves only a human line with a time (trace's live lines);
    `vpnw run` that prints none never loads it."""
    loaded = _modules_after("from stages.recorder import main, human", tmp_path)
    assert "stages.recorder.human" in loaded     # control
    assert "calendar" not in loaded


RUN_PARSED = prog_text("run_parsed.py")


def test_a_run_makes_only_its_own_command(tmp_path):
    """`vpnw run` builds run's click options, not trace's and guard's too;
    every command is still there for --help and for a mistyped name."""
    from click.testing import CliRunner

    from stages.orchestrator import cli
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", RUN_PARSED], check=True, cwd=tmp_path, env=env,
                         capture_output=True, text=True).stdout.splitlines()
    assert out == ["executed run ['true'] True", "['run']"]
    runner = CliRunner()
    typo = runner.invoke(cli.cli, ["rnu", "--", "true"])
    assert typo.exit_code == 2 and "Did you mean 'run'?" in typo.output
    listed = runner.invoke(cli.cli, ["--help"]).output
    assert all(f"  {name} " in listed for name in ("run", "trace", "guard", "learn", "show"))


def _loaded_at_the_forks(tmp_path) -> tuple[set[str], set[str]]:
    """What vpnw has loaded when it forks the helper, and the recorder."""
    helper, recorder = modules_loaded(AT_THE_FORKS, "on" if startup.ON else "off", tmp_path)
    return helper, recorder


@needs_the_tricks      # quick_parse's way: click's loads the run's modules first
def test_the_helper_forks_before_the_run_modules_and_the_policy_load(tmp_path):
    """The helper is forked first, right after the command line is read
    (stages/orchestrator/helper_first.py): its imports and its seccomp filter
    run while vpnw loads the run's modules and the policy, not after them."""
    helper, recorder = _loaded_at_the_forks(tmp_path)
    assert {"stages.orchestrator.run", "stages.config.policy"} <= recorder    # control: loaded later
    assert "stages.orchestrator.options" in helper                            # control: parsed first
    assert not {"stages.orchestrator.run", "stages.config.policy", "stages.config.protected",
                "stages.record.events", "dataclasses"} & helper


@needs_the_tricks
def test_a_plain_run_loads_no_click_and_no_file_limits_before_the_recorder(tmp_path):
    """`vpnw run -- true` as the console script starts it, up to the recorder's
    fork (vpnw's part of the start: every module loaded by then is on the
    critical path): the command line is read without click
    (options.quick_parse), and a policy without [files] needs no file_limits
    (its dataclasses)."""
    _helper, loaded = _loaded_at_the_forks(tmp_path)
    assert {"stages.orchestrator.run", "stages.config.protected"} <= loaded   # control: at the fork
    assert not {m for m in loaded if m.split(".")[0] == "click"}
    assert "stages.config.file_limits" not in loaded


# What dataclasses and orjson bring (inspect: ast, dis, tokenize; uuid:
# platform), ~20 ms of CPU before the seal when they were on its way; and
# typing (~4 ms), whose NamedTuple and TYPE_CHECKING startup.records stands in for.
OFF_THE_WAY = {"orjson", "dataclasses", "inspect", "uuid", "platform", "typing"}


@needs_the_tricks
def test_the_run_forks_its_helper_before_the_records_modules(tmp_path):
    """At the helper's fork (every module vpnw has loaded is one the helper
    starts with) there is no orjson, no dataclasses and nothing they bring:
    the helper is forked before the run's modules (helper_first.py), and
    the record's modules load after the fork.
    Control: at the recorder's fork, the next one, orjson is loaded (the
    listing would show it)."""
    at_helper, at_recorder = _loaded_at_the_forks(tmp_path)
    assert {"stages.orchestrator.helper_first", "stages.wire.exits"} <= at_helper   # control
    assert OFF_THE_WAY & at_helper == set()
    assert {"orjson", "stages.record.events"} <= at_recorder      # control


@needs_the_tricks
@pytest.mark.world
def test_the_helper_reaches_ready_without_the_records_modules(world, user):
    """A real run, every import of every process seen (an audit hook):
    what the helper had loaded when it sent Ready (vpnw's modules at the
    fork, and its own after it) has no orjson, no dataclasses and nothing
    they bring, and no typing (pyseccomp's imports it with a stand-in). Control: the same listing has the helper's own modules,
    and vpnw, in the same run, loads orjson before it forks the recorder."""
    work = world.workdir(user)
    at, imported = audited_run(world, user, work, ["run", "--record", str(work / "run.jsonl"), "--", "true"],
                               python_flags=())
    vpnw_forked, vpnw_pid = at[("vpnw", "helper forked")]
    ready, helper_pid = at[("helper", "Ready sent")]
    recorder_forked = at[("vpnw", "recorder forked")][0]
    loaded, by_the_recorders_fork = set(), set()
    for ns, pid, name in imported:
        if (pid == vpnw_pid and ns < vpnw_forked) or (pid == helper_pid and ns < ready):
            loaded.add(name)
        if pid == vpnw_pid and ns < recorder_forked:
            by_the_recorders_fork.add(name)
    assert {"stages.helper.seal", "stages.wire.status", "_json"} <= loaded        # control
    assert "orjson" in by_the_recorders_fork                                      # control
    assert OFF_THE_WAY & loaded == set()


@needs_the_tricks
def test_the_recorder_writes_run_start_without_typing(tmp_path):
    """What vpnw loads before it forks the recorder (the record's modules)
    and what the recorder loads to write and sign a record: no typing
    (~4 ms of CPU on the way to run.start; annotations need none).
    Control: orjson and the recorder's modules are there."""
    loaded = _modules_after("from stages.record import events, gate, ledger, signing\n"
                            "from stages.recorder import main, seal", tmp_path)
    assert {"orjson", "stages.recorder.main", "stages.record.signing"} <= loaded   # control
    assert "typing" not in loaded


@needs_the_tricks
def test_the_recorder_makes_no_dataclass_on_its_way_to_run_start():
    """Each dataclass execs its generated methods when its module loads
    (~1 ms of CPU each under load): the recorder's modules, loaded between
    its fork and run.start written, make none (startup.records instead).
    Control: the check sees a dataclass where there is one."""
    import dataclasses
    import importlib
    names = ["stages.record.chain", "stages.record.digests", "stages.record.events",
             "stages.record.gate", "stages.recorder.main", "stages.recorder.feeder",
             "stages.recorder.hints", "stages.recorder.human", "stages.recorder.reserve"]
    made = [f"{name}.{key}" for name in names
            for key, value in vars(importlib.import_module(name)).items()
            if isinstance(value, type) and dataclasses.is_dataclass(value)
            and value.__module__ == name]
    assert made == []
    from stages.config import wg_quick
    assert dataclasses.is_dataclass(wg_quick.WgConf)      # control


FILTERS = prog_text("pyseccomp_filters.py")


@needs_the_tricks
def test_pyseccomp_imports_without_typing_and_makes_the_same_filter(tmp_path):
    """The helper imports pyseccomp with a stand-in typing (its annotations,
    cast and overload only; stages/startup/imports.py): typing never loads,
    the filter's BPF is byte for byte the one made with the real typing,
    every way, and a later `import typing` is the real one.
    Control: with typing imported first, the stand-in steps aside."""
    def run(first):
        env = {**os.environ, "PYTHONPATH": ROOT}
        out = subprocess.run([sys.executable, "-c", FILTERS, *first], check=True,
                             cwd=tmp_path, env=env, capture_output=True, text=True)
        return json.loads(out.stdout.splitlines()[-1])
    light, real = run([]), run(["typing-first"])
    assert light[0] is False and real[0] is True            # control: typing there only when asked
    assert light[1] == real[1] and len(set(light[1])) > 1    # the same filters, each way
    assert light[2:] == real[2:] == [True, True]

"""run, trace and guard's quick parser (stages/orchestrator/options.py) and
click read a command line the same way: where the quick parser answers, its
answer is what click hands the command; where click would say anything (help,
an error) the quick parser steps aside, so click says it. And a run that
parses cleanly starts without importing click (the start-up budget,
docs/architecture.md)."""
from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from progs_support import prog_text
from stages.orchestrator import cli, options
from startup_support import needs_the_tricks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _click_reads(monkeypatch, words):
    """(mode, {dest: value, "program": tuple}) as click hands it to the
    command, or "refused" when click says something instead."""
    seen = []
    monkeypatch.setattr(cli, "_execute",
                        lambda mode, program, **opts: seen.append((mode, {**opts, "program": program})) or 0)
    try:
        cli.cli.main(list(words), prog_name="vpnw", standalone_mode=False)
    except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
        return "refused"
    return seen[0] if seen else "refused"


# (words, whether the quick parser takes them)
LINES = [
    (["run", "--", "true"], True),
    (["run", "true"], True),
    (["run", "echo", "--quiet", "--", "x"], True),          # the program's own words
    (["run", "--quiet", "--capture", "--record", "-", "--", "true"], True),
    (["trace", "--record=r.jsonl", "--via", "office", "--config", "c.toml", "--", "npm", "i"], True),
    (["run", "--syslog", "--", "true"], True),               # no target: /dev/log
    (["run", "--syslog", "--quiet", "--", "true"], True),
    (["run", "--syslog", "tcp://[::1]:514", "--events-format", "ocsf", "--", "true"], True),
    (["run", "--syslog=udp://h:514", "--", "true"], True),
    (["run", "--events-to", "cat > x", "--events-format", "ecs", "--", "true"], True),
    (["run", "--log", "vpnw-log-not-there.txt", "--", "true"], True),
    (["run", "--allow-unix-sockets", "--no-clipboard", "--", "true"], True),
    (["run", "-", "x"], True),
    (["run", "--", "--", "x"], True),
    (["guard", "--policy", "p.toml", "--", "true"], True),
    (["guard", "--policy", "@claude-code", "--dry-run", "--ask", "--ask-timeout", "2.5", "--", "t"], True),
    (["guard", "--ask-timeout=1", "--policy=p.toml", "true"], True),
    # click says something (or might): the quick parser steps aside
    (["run"], False),
    (["run", "--"], False),
    (["run", "--help"], False),
    (["run", "-h", "--", "true"], False),
    (["run", "--bogus", "--", "true"], False),
    (["run", "--quie", "--", "true"], False),
    (["run", "--quiet=1", "--", "true"], False),
    (["run", "--quiet", "--quiet", "--", "true"], False),
    (["run", "--policy", "a", "--policy", "b", "--", "true"], False),
    (["run", "--policy"], False),
    (["run", "--policy", "--quiet", "--", "true"], False),
    (["run", "--policy=", "--", "true"], False),
    (["run", "--events-format", "cef", "--", "true"], False),
    (["run", "--log", "/tmp", "--", "true"], False),         # a directory: click's message
    (["run", "--dry-run", "--", "true"], False),             # guard's option only
    (["guard", "--", "true"], False),                         # --policy is required
    (["guard", "--policy", "p", "--ask-timeout", "0.5", "--", "t"], False),
    (["guard", "--policy", "p", "--ask-timeout", "1e3", "--", "t"], False),
    (["guard", "--policy", "p", "--ask-timeout", "nan", "--", "t"], False),
    (["run", "-q", "--", "true"], False),
]


@pytest.mark.parametrize("words,quick", LINES, ids=[" ".join(w) for w, _ in LINES])
def test_the_quick_parser_reads_what_click_reads(monkeypatch, words, quick):
    answer = options.quick_parse(words[0], words[1:])
    assert (answer is not None) == quick
    if quick:
        assert _click_reads(monkeypatch, words) == (words[0], answer)


def test_a_line_click_refuses_is_never_read_quickly(monkeypatch):
    refused = [w for w, quick in LINES if _click_reads(monkeypatch, w) == "refused"]
    # control: click refuses 14 of them (the others it takes, a repeated
    # option, a value like an option, are left to it all the same)
    assert len(refused) >= 14
    assert all(options.quick_parse(w[0], w[1:]) is None for w in refused)


WORDS = st.sampled_from(
    ["--", "-", "--policy", "--config", "--via", "--record", "--log", "--quiet", "--events-to",
     "--syslog", "--events-format", "--allow-unix-sockets", "--capture", "--no-clipboard",
     "--dry-run", "--ask", "--ask-timeout", "--help", "-h", "--polic", "--quiet=", "--via=x",
     "--record=-", "--syslog=/dev/log", "jsonl", "ocsf", "cef", "2", "0.9", "60.5", "-1", "x",
     "true", "p.toml", "@claude-code", "/tmp", "", "--ask-timeout=3", "--events-format=ecs"])


@settings(max_examples=400, deadline=None, derandomize=True)   # the same lines on every run: no flaky red
@given(mode=st.sampled_from(options.SANDBOXED), words=st.lists(WORDS, max_size=8))
def test_any_line_the_quick_parser_reads_click_reads_the_same(mode, words):
    answer = options.quick_parse(mode, words)
    if answer is None:
        return
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert _click_reads(monkeypatch, [mode, *words]) == (mode, answer)


def test_click_is_built_from_the_same_table():
    """Every option in the table is an option of the click command, and no other."""
    group_context = click.Context(cli.cli)
    for mode in options.SANDBOXED:
        command = cli.cli.get_command(group_context, mode)
        on_click = {p.name: p.opts for p in command.params if isinstance(p, click.Option)}
        assert on_click == {o.dest: [o.name] for o in options.options_of(mode)}


QUICK_RUN = prog_text("quick_run.py")


def _entry(args, env=None):
    return subprocess.run([sys.executable, "-c", QUICK_RUN, *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})


@needs_the_tricks
def test_a_clean_run_starts_without_click():
    done = _entry(["run", "--quiet", "--", "true"])
    assert done.stdout.splitlines() == ["executed run ['true']", "exit 0", "False"]
    helped = _entry(["run", "--help"])              # control: click's own help
    assert "Usage: vpnw run [OPTIONS] [--] PROGRAM..." in helped.stdout
    assert helped.stdout.splitlines()[-2:] == ["exit 0", "True"]


def test_a_bad_environment_is_said_the_same_both_ways():
    """The environment's check comes first on both ways (click's group
    callback, or main.py before the run): same message, same 121."""
    env = {"VPNW_BROKER_WORKERS": "many"}
    quick = _entry(["run", "--", "true"], env)
    slow = _entry(["run", "--quiet=1", "--", "true"], env)     # click parses this one
    assert quick.stderr.startswith("vpnw: VPNW_BROKER_WORKERS") and "exit 121" in quick.stdout
    assert (quick.stderr, quick.stdout.splitlines()[-2]) == (slow.stderr, slow.stdout.splitlines()[-2])

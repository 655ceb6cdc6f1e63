"""The policies shipped with vpnw (stages/config/presets/): each is a valid
deny-by-default policy, listed by `vpnw presets`, printed by `vpnw presets
NAME`, and an unknown name is a usage error (121). The agents suite
(tests/test_agents.py) checks each agent's trace against its preset and runs
one as `--policy @claude-code`."""
from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from stages.config import presets
from stages.config.policy import load_policy, parse_policy

AGENTS = ("aider", "anthropic-python", "claude-code", "codex", "copilot", "gemini-cli", "litellm", "opencode",
          "openai-python")


def vpnw(*args):
    return subprocess.run([sys.executable, "-m", "stages", *args], capture_output=True, text=True)


def test_every_agent_in_the_suite_has_a_preset():
    assert set(AGENTS) <= set(presets.names())


@pytest.mark.parametrize("name", presets.names())
def test_each_preset_is_a_deny_by_default_policy_named_after_it(name):
    policy = load_policy(presets.path(name))
    assert policy.name == name
    raw = tomllib.loads(presets.text(name))
    assert raw["policy"]["default"] == "deny" and raw["policy"]["allow"]
    # What the user copies out parses the same.
    assert parse_policy(vpnw("presets", name).stdout).name == name


def test_presets_lists_each_with_what_it_is_for():
    r = vpnw("presets")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [f"@{n}" for n in presets.names()]
    assert any("Claude Code" in line for line in lines)


def test_an_unknown_preset_is_a_usage_error():
    for args in (("presets", "nope"), ("guard", "--policy", "@nope", "--", "true")):
        r = vpnw(*args)
        assert r.returncode == 121, r
        assert "no preset named 'nope'" in r.stderr and "claude-code" in r.stderr, r.stderr


def test_ask_never_edits_a_preset():
    r = vpnw("guard", "--ask", "--policy", "@claude-code", "--", "true")
    assert r.returncode == 121 and "vpnw presets claude-code > policy.toml" in r.stderr, r.stderr

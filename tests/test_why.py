"""`vpnw why HOST[:PORT]` (issue 44): the policy corners' table asked through
`why`, which must name the step and rule that guard's broker applies (the
same decide.py), where the rule is written, and never dial. The command
itself runs in a network namespace of its own (`unshare -n`): a name it
looked up or an address it dialled would fail there, not leave the machine."""
from __future__ import annotations

import shutil
import subprocess
import sys
from ipaddress import ip_address

import pytest

from stages.broker.decide import decide, parse_target
from stages.config.paths import DIRECT
from stages.config.policy import Policy, parse_policy
from stages.orchestrator.why_command import BadDestination, explain, parse_destination
from test_e2e_policy_corners import CORNERS

SOURCE = "corners.toml"
POLICY = parse_policy(f'version = 1\nname = "agent"\n[policy]\n{CORNERS}', SOURCE)

# (destination, the step, the rule, the line it is written on or None): the corners'
# table, by the steps of decide.py.
TABLE = [
    ("evil.example", 1, 'deny "evil.example" (line 7)', 7),
    ("140.82.112.66:80", 2, 'deny "::ffff:140.82.112.66" (line 7)', 7),
    ("localhost", 3, "deny_private", 5),
    ("printer.local", 3, "deny_private", 5),
    ("metadata.google.internal", 3, "deny_private", 5),
    ("intranet", 3, "deny_private", 5),
    ("169.254.169.254:80", 3, "deny_private", 5),
    ("140.82.112.6:80", 5, 'allow "140.82.112.0/20" (line 6)', 6),
    ("[64:ff9b::8c52:7006]:80", 6, "default", None),
    ("api.github.com", 6, "default", None),
]


@pytest.mark.parametrize("destination,step,rule,line", TABLE, ids=[row[0] for row in TABLE])
def test_why_names_the_step_and_rule_that_guard_applies(destination, step, rule, line):
    host, port = parse_destination(destination)
    target = parse_target(host, port)
    allowed, lines = explain(target, POLICY, path=DIRECT, lookup=None)
    text = "\n".join(lines)
    assert f"at step {step} (" in text and f"rule: {rule}" in text, text
    if line is not None:
        assert f"written at: {SOURCE} line {line}" in text, text
    assert lines[-1] == "  nothing was dialled"
    # The same answer as the broker's decide().
    verdict = decide(target, POLICY)
    assert allowed is verdict.allowed and verdict.rule == rule


OPEN = parse_policy('version = 1\n[policy]\ndefault = "allow"\ndeny_private = false\n'
                    'allow = ["localhost:18941", "169.254.169.254:80"]\n', "open.toml")


@pytest.mark.parametrize("policy,destination,expect", [
    (Policy.allow_all(), "127.0.0.1:18942", 'run it under a policy (--policy) whose allow list holds '
                                              '"localhost:18942"'),
    (OPEN, "[fd00:ec2::254]:80", 'add "[fd00:ec2::254]:80" to the allow list of open.toml'),
    (OPEN, "169.254.169.254:81", 'add "169.254.169.254:81" to the allow list of open.toml'),
])
def test_why_says_the_machine_step_and_the_rule_to_add(policy, destination, expect):
    host, port = parse_destination(destination)
    allowed, lines = explain(parse_target(host, port), policy, path=DIRECT)
    text = "\n".join(lines)
    assert allowed is False and "at step 4 (the machine itself)" in text and expect in text, text


def test_why_tells_the_local_door_from_the_proxy_doors():
    allowed, lines = explain(parse_target("localhost", 18941), OPEN, path=DIRECT)
    assert allowed is True
    assert lines[1].startswith('  allowed at the door localhost:18941 inside the sandbox: allow rule '
                               '"localhost:18941" (open.toml line 5)'), lines
    assert "at step 4 (the machine itself)" in "\n".join(lines)


def test_a_name_is_looked_up_only_where_the_broker_would_and_it_says_so():
    asked = []

    def lookup(host, port):
        asked.append(host)
        return (ip_address("203.0.113.7"),) if host == "ok.example" else (ip_address("169.254.169.254"),)
    allowed, lines = explain(parse_target("ok.example", 443), Policy.allow_all(), path=DIRECT, lookup=lookup)
    assert allowed is True and "  looked up here, as the broker would: ok.example -> 203.0.113.7" in lines
    allowed, lines = explain(parse_target("metadata.world", 80), Policy.allow_all(), path=DIRECT,
                             lookup=lookup)
    assert allowed is False and "at step 4 (the machine itself)" in "\n".join(lines)
    asked.clear()
    allowed, lines = explain(parse_target("evil.example", 443), POLICY, path=DIRECT, lookup=lookup)
    assert asked == [] and "  not looked up: a denied name never is" in lines
    # --no-resolve: undecided where an address could change the answer.
    allowed, lines = explain(parse_target("x.internal.example", 443), parse_policy(
        'version = 1\n[policy]\ndeny_private = true\ndefault = "allow"\n', "p.toml"), path=DIRECT)
    assert allowed is None and "undecided" in lines[1], lines


@pytest.mark.parametrize("text", ["[::1", "evil.example:0", "evil.example:http", "[::1]x"])
def test_a_bad_destination_is_refused(text):
    with pytest.raises(BadDestination):
        parse_destination(text)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")
def test_the_command_in_a_network_of_its_own(tmp_path):
    policy = tmp_path / "corners.toml"
    policy.write_text(f'version = 1\nname = "agent"\n[policy]\n{CORNERS}')
    run = subprocess.run(["unshare", "-n", "--", sys.executable, "-m", "stages", "why", "--policy",
                          str(policy), "evil.example"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 120, run
    assert 'denied at step 1 (deny rules on the name), rule: deny "evil.example" (line 7)' in run.stdout
    assert f"written at: {policy} line 7" in run.stdout
    run = subprocess.run(["unshare", "-n", "--", sys.executable, "-m", "stages", "why", "evil.example:0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 121 and "is not a port" in run.stderr, run

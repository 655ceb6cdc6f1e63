"""The round trip, in the test world, as root and as an unprivileged user:
`vpnw trace` a workload, `vpnw learn` a draft from it, `vpnw guard` the same
workload under that draft. The guarded run must pass with no denial, and the
draft must allow nothing the trace did not show. Then `guard --dry-run` under a
draft with one destination taken out: the connection goes through, the record
says it would have been denied, and vpnw exits 120."""
from __future__ import annotations

import ipaddress
import json
import sys
from pathlib import Path

import pytest

from e2e_support import assert_every_connection_accounted, describe, opened, run_events
from progs_support import prog_text
from stages.config.host_rules import Rule
from stages.config.policy import Policy, parse_policy
from stages.record.check import check_run
from world import DEMO_PACKAGE, DEMO_VALUE, GIT_README

pytestmark = pytest.mark.world
PLAIN_PORTS = (80, 443)

URLLIB_TWO_HOSTS = prog_text("urllib_two_hosts.py")


def workload(world, name: str, work: Path) -> tuple[list[str], dict, object]:
    """(argv, env, check(stdout)) of a workload writing under `work` (fresh each run)."""
    ca = str(world.ca_pem)
    if name == "curl":
        def check(out):
            assert json.loads(out)["host"] == "api.github.com"
        return ["curl", "-sS", "--max-time", "30", "--cacert", ca, "https://api.github.com/whoami"], {}, check
    if name == "pip":
        def check(out):
            assert DEMO_VALUE in (work / "site" / DEMO_PACKAGE.replace("-", "_") / "__init__.py").read_text()
        return ([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--cert", ca,
                 "--index-url", "https://pypi.world/simple", "--target", str(work / "site"), DEMO_PACKAGE],
                {"PIP_CONFIG_FILE": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, check)
    if name == "git":
        def check(out):
            assert (work / "repo" / "README").read_text() == GIT_README
        return ["git", "clone", "-q", "http://git.world/repo.git", str(work / "repo")], {}, check
    if name == "urllib":
        program = world.file("urllib_two_hosts.py", URLLIB_TWO_HOSTS)
        def check(out):
            assert out.split() == ["api.github.com", "files.pythonhosted.org"]
        return [sys.executable, str(program), ca], {}, check
    raise AssertionError(name)


def canonical(host: str) -> str:
    return host.lower().rstrip(".").strip("[]")


def rule_was_seen(rule: Rule, seen: set[tuple[str, int]]) -> bool:
    """Does an allow rule stand for a destination the trace reached? A rule
    without a port stands for 80 and 443 (how learn writes those)."""
    def port_ok(port: int) -> bool:
        return port == rule.port if rule.port is not None else port in PLAIN_PORTS
    if rule.kind == "name":
        return any(host == rule.host and port_ok(port) for host, port in seen)
    if rule.kind == "ip" and rule.network.num_addresses == 1:
        for host, port in seen:
            try:
                if ipaddress.ip_address(host) == rule.network.network_address and port_ok(port):
                    return True
            except ValueError:
                continue
    return False  # wildcards and CIDR blocks are never drafted


def assert_no_denial(events: list[dict]) -> None:
    assert [e for e in events if e["type"] == "policy.deny"] == []
    end = events[-1]["fields"]
    assert (end["denied"], end["would_deny"], end["failed"]) == (0, 0, 0), end


def trace_and_learn(world, user: str, name: str) -> tuple[list[dict], str, Policy]:
    state = world.state_home(user)
    argv, env, check = workload(world, name, world.workdir(user))
    traced = world.vpnw(["trace", "--", *argv], user=user, env=env, state_home=state, timeout=120)
    assert traced.returncode == 0, describe(traced)
    check(traced.stdout)
    events = run_events(traced)
    assert check_run(events) == []
    assert_no_denial(events)
    learned = world.vpnw(["learn", "--name", name], user=user, state_home=state)
    assert learned.returncode == 0, describe(learned)
    return events, learned.stdout, parse_policy(learned.stdout, f"{name}.toml")


@pytest.mark.parametrize("name", ["curl", "pip", "git", "urllib"])
def test_trace_learn_guard_round_trip(world, user, name):
    events, draft, policy = trace_and_learn(world, user, name)
    seen = {(canonical(h), p) for h, p, _ in opened(events)}
    assert seen, "the workload made no connection"
    # The draft allows nothing the trace did not show ...
    assert policy.allow, draft
    for rule in policy.allow:
        assert rule_was_seen(rule, seen), f"{rule.text} (line {rule.line}) is not in the trace {seen}\n{draft}"
    assert (policy.default, policy.deny_private, policy.deny) == ("deny", True, ()), draft
    # ... and everything it did show.
    for host, port in seen:
        assert policy.allow_index.match_name(host, port) is not None, f"{host}:{port} not allowed\n{draft}"

    argv, env, check = workload(world, name, world.workdir(user))
    policy_file = world.file(f"{name}-{user}.toml", draft)
    guarded = world.vpnw(["guard", "--policy", str(policy_file), "--", *argv], user=user, env=env,
                         timeout=120)
    assert guarded.returncode == 0, f"{describe(guarded)}\n--- draft\n{draft}"
    check(guarded.stdout)
    guard_events = run_events(guarded)
    assert check_run(guard_events) == []
    assert_no_denial(guard_events)
    assert " DENY " not in guarded.stderr and "WOULD DENY" not in guarded.stderr
    assert {(canonical(h), p) for h, p, _ in opened(guard_events)} == seen


def test_dry_run_lets_a_denied_connection_through_and_says_so(world, user):
    events, draft, policy = trace_and_learn(world, user, "urllib")
    taken_out = "files.pythonhosted.org"
    lines = draft.splitlines(keepends=True)
    reviewed = "".join(line for line in lines if not line.lstrip().startswith(f'"{taken_out}"'))
    assert len(reviewed.splitlines()) == len(lines) - 1, draft
    assert taken_out not in {r.host for r in parse_policy(reviewed).allow}
    policy_file = world.file(f"dry-run-{user}.toml", reviewed)

    argv, env, check = workload(world, "urllib", world.workdir(user))
    mark = world.dns_mark()
    r = world.vpnw(["guard", "--dry-run", "--policy", str(policy_file), "--", *argv], user=user,
                   env=env, timeout=120)
    assert r.returncode == 120, describe(r)
    check(r.stdout)  # the client reached both hosts: nothing was stopped
    would = [line for line in r.stderr.splitlines() if "WOULD DENY" in line]
    assert len(would) == 1 and f"{taken_out}:443" in would[0], r.stderr
    assert " DENY " not in r.stderr.replace("WOULD DENY", ""), r.stderr
    events = run_events(r)
    assert check_run(events) == []
    assert events[0]["fields"]["dry_run"] is True
    by_conn = assert_every_connection_accounted(events)
    denials = [(by_conn[e["conn"]][0]["fields"]["host"], e["fields"]) for e in events
               if e["type"] == "policy.deny"]
    assert len(denials) == 1, denials
    host, fields = denials[0]
    assert host == taken_out and fields["enforced"] is False, denials
    assert {h for h, _, _ in opened(events)} == {"api.github.com", taken_out}
    end = events[-1]["fields"]
    assert (end["exit_code"], end["denied"], end["would_deny"]) == (120, 0, 1), end
    # Under a dry run the name is looked up as it would be to decide: the
    # connection really went out.
    assert taken_out in world.dns_queries(since=mark)

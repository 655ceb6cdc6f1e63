"""The demo's story (scripts/demo_world.py), told in the test world as root and
as an unprivileged user: the trace sees the leak, the draft allows and flags
the attacker's server, the reviewed policy stops the leak with exit 120 and
the attacker receives nothing. Then the driver itself, start to finish."""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stages.config.policy import parse_policy
from stages.record.check import check_run

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import demo_world  # noqa: E402

pytestmark = pytest.mark.world
ATTACKER = demo_world.ATTACKER


def records(story) -> dict[str, list[dict]]:
    """mode -> events of each run the story made."""
    out = {}
    for path in sorted((story.state_home / "vpnw" / "runs").glob("*.jsonl")):
        events = [json.loads(line) for line in path.read_text().splitlines()]
        out[events[0]["fields"]["mode"]] = events
    return out


def hosts(events, type_) -> list[str]:
    requests = {e["conn"]: e["fields"]["host"] for e in events if e["type"] == "conn.request"}
    return [requests[e["conn"]] for e in events if e["type"] == type_]


def test_the_story(world, user):
    out = io.StringIO()
    story = demo_world.run_story(world, user=user, out=demo_world.Printer(out))
    told = out.getvalue()
    assert story.problems == [], told

    # 1. The trace printed the connection to the attacker's server, and it got through.
    assert story.trace.code == 0, told
    assert re.search(rf"^vpnw .*#\d+ +→ {re.escape(ATTACKER)}:443 ", story.trace.stderr, re.M), told
    assert "evil.example/upload?drop=token -> 200" in story.trace.stdout, told
    assert story.leaked_in_trace and story.looked_up_in_trace

    # 2. The draft allows it (the agent went there) and flags it for review.
    draft = parse_policy(story.draft, "agent.draft.toml")
    assert {r.host for r in draft.allow} == {"api.github.com", "pypi.org", ATTACKER}, story.draft
    review = story.draft.split("# Needs review:", 1)[1].split("\nversion", 1)[0]
    assert f"#     {ATTACKER}: seen once" in review, story.draft
    assert re.search(rf"#     {re.escape(ATTACKER)}:443: reached at 203\.0\.113\.66", review), story.draft

    # 3. The person's edit takes out that one entry and nothing else.
    reviewed = parse_policy((story.workdir / "agent.toml").read_text(), "agent.toml")
    assert {r.host for r in reviewed.allow} == {"api.github.com", "pypi.org"}
    assert (reviewed.default, reviewed.deny_private) == ("deny", True)

    # 4. Guarded: the honest work passes, the leak is denied, exit 120.
    assert story.guard.code == 120, told
    deny_lines = [line for line in story.guard.stderr.splitlines() if " DENY " in line]
    assert len(deny_lines) == 1 and f"{ATTACKER}:443" in deny_lines[0], told
    assert "api.github.com -> 200" in story.guard.stdout and "pypi.org -> 200" in story.guard.stdout
    assert "evil.example/upload?drop=token -> failed" in story.guard.stdout, told
    # The attacker received nothing and its name was never even looked up.
    assert not story.leaked_under_guard and not story.looked_up_under_guard

    runs = records(story)
    assert set(runs) == {"trace", "guard"}
    for events in runs.values():
        assert check_run(events) == []
    assert ATTACKER in hosts(runs["trace"], "conn.open")
    assert hosts(runs["guard"], "policy.deny") == [ATTACKER]
    assert ATTACKER not in hosts(runs["guard"], "conn.open")
    assert not any(e["type"] == "dns.resolve" and e["fields"]["host"] == ATTACKER
                   for e in runs["guard"])
    assert runs["guard"][-1]["fields"]["exit_code"] == 120


def test_the_driver_tells_the_story_and_cleans_up(world):
    # `world` only for its preconditions (root, the tools): the driver builds its own.
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "demo_world.py")],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sections = re.findall(r"^== (.*) ==$", proc.stdout, re.M)
    assert sections == ["Building the world", "The agent and its task",
                        "1. vpnw trace: watch every connection",
                        "2. vpnw learn: draft a policy from that trace",
                        f"3. A person reads the draft and takes {ATTACKER} out",
                        "4. vpnw guard: the same agent, the same task, under the reviewed policy",
                        "What happened"], proc.stdout
    assert "The story did NOT go as told" not in proc.stdout
    tmp = re.search(r"(/tmp/vpnw-world-\S+)\s+is\s+removed", proc.stdout)
    assert tmp and not Path(tmp.group(1)).exists(), proc.stdout

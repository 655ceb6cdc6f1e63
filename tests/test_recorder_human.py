"""The human lines, byte for byte (stages/recorder/human.py)."""
from __future__ import annotations

import time

import pytest

from stages.recorder.human import HumanState, format_event, human_bytes, human_lines, printable

TS = "2026-09-29T11:44:36.244123456Z"


def ev(type_, fields, conn=None, ts=TS, run="r-36e0ba"):
    return {"v": 1, "ts": ts, "type": type_, "run": run, "pid": 1, "path": "direct",
            "conn": conn, "fields": fields}


def utc(**kw):
    return HumanState(localtime=time.gmtime, **kw)


def test_the_three_lines_of_the_description():
    state = utc()
    assert format_event(ev("conn.request", {"door": "http", "kind": "http-connect",
                                            "host": "api.github.com", "port": 443}, 1), state) \
        == "vpnw 11:44:36.244  #1   → api.github.com:443  http-connect"
    assert format_event(ev("conn.open", {"address": "140.82.112.6", "port": 443, "via": "direct",
                                         "ms": 0.4}, 1, ts="2026-09-29T11:44:36.245Z"), state) \
        == "vpnw 11:44:36.245  #1     open  140.82.112.6 via direct  (0 ms)"
    format_event(ev("conn.request", {"door": "http", "kind": "http-connect",
                                     "host": "evil.example", "port": 443}, 5), state)
    reason = "no allow rule matches evil.example:443; default is deny (set in the policy)"
    assert format_event(ev("policy.deny", {"rule": "default", "reason": reason, "enforced": True},
                           5, ts="2026-09-29T11:44:36.387999Z"), state) \
        == f"vpnw 11:44:36.387  #5     DENY   evil.example:443  {reason}"
    assert 5 not in state.conns  # an enforced denial ends the connection


def test_local_time(monkeypatch):
    monkeypatch.setenv("TZ", "EET-3")
    time.tzset()
    try:
        line = format_event(ev("conn.request", {"door": "socks", "kind": "socks5",
                                                "host": "pypi.org", "port": 443}, 12), HumanState())
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert line == "vpnw 14:44:36.244  #12  → pypi.org:443  socks5"


def test_every_other_line():
    state = utc()
    assert format_event(ev("run.start", {"mode": "guard", "program": "agent", "policy": "agent",
                                         "policy_file": "/p/agent.toml", "via": "office",
                                         "dry_run": True, "allow_unix_sockets": True,
                                         "version": "0.1.0", "record": "-"}), state) \
        == "vpnw 11:44:36.244  run r-36e0ba: guard agent  (via office, policy agent, dry run, unix sockets allowed)"
    assert format_event(ev("run.start", {"mode": "trace", "program": "git", "policy": None,
                                         "policy_file": None, "via": "direct", "dry_run": False,
                                         "allow_unix_sockets": False, "version": "0.1.0", "record": "-",
                                         "env_kept": ["GIT_SSH_COMMAND", "npm_config\x1b"]}), state) \
        == "vpnw 11:44:36.244  run r-36e0ba: trace git  (via direct, kept your GIT_SSH_COMMAND npm_config\\x1b)"
    assert format_event(ev("path.check", {"path": "office", "type": "proxy", "ok": True, "ms": 12.2}),
                        state) == "vpnw 11:44:36.244  path office ok  (proxy, 12 ms)"
    assert format_event(ev("path.check", {"path": "office", "type": "proxy", "ok": False, "ms": 1,
                                          "error": "connection refused"}), state) \
        == "vpnw 11:44:36.244  path office DOWN: connection refused"
    assert format_event(ev("sandbox.ready", {"namespaces": ["user", "net"], "seccomp": True,
                                             "unix_sockets": False,
                                             "doors": {"http": 3128, "socks": 1080}}), state) \
        == "vpnw 11:44:36.244  sandbox ready: user net; seccomp on; no unix sockets; doors http 3128, socks 1080"
    format_event(ev("conn.request", {"door": "socks", "kind": "socks5", "host": "2001:db8::1",
                                     "port": 8080}, 7), state)
    assert format_event(ev("dns.resolve", {"host": "a.example", "addresses": ["1.2.3.4", "::1"],
                                           "ms": 2.6}, 7), state) \
        == "vpnw 11:44:36.244  #7     dns  a.example → 1.2.3.4, ::1  (3 ms)"
    assert format_event(ev("dns.resolve", {"host": "a.example", "addresses": [], "ms": 5,
                                           "error": "NXDOMAIN"}, 7), state) \
        == "vpnw 11:44:36.244  #7     dns  a.example: NXDOMAIN  (5 ms)"
    assert format_event(ev("policy.allow", {"rule": "x", "reason": "y"}, 7), state) is None
    assert format_event(ev("policy.deny", {"rule": "default", "reason": "nope", "enforced": False}, 7),
                        state) == "vpnw 11:44:36.244  #7     WOULD DENY   [2001:db8::1]:8080  nope"
    assert format_event(ev("conn.close", {"bytes_up": 1234, "bytes_down": 3_400_000, "ms": 12.4}, 7),
                        state) == "vpnw 11:44:36.244  #7     close  ↑1.2 kB ↓3.4 MB  (12 ms)"
    format_event(ev("conn.request", {"door": "http", "kind": "http-forward", "host": "x.example",
                                     "port": 80}, 8), state)
    assert format_event(ev("conn.fail", {"stage": "dial", "error": "refused",
                                         "reason": "x.example:80 refused the connection"}, 8), state) \
        == "vpnw 11:44:36.244  #8     FAIL   x.example:80  x.example:80 refused the connection"
    assert state.conns == {}
    assert format_event(ev("program.exit", {"code": 3, "signal": None}), state) \
        == "vpnw 11:44:36.244  program exited with code 3"
    assert format_event(ev("program.exit", {"code": None, "signal": 9}), state) \
        == "vpnw 11:44:36.244  program killed by signal 9"
    assert format_event(ev("run.end", {"exit_code": 0, "connections": 12, "denied": 0,
                                       "would_deny": 1, "failed": 1, "ms": 900}), state) \
        == "vpnw 11:44:36.244  run r-36e0ba: 12 connections, 0 denied, 1 would be denied, 1 failed; exit 0; record on stdout"


def test_run_mode_prints_only_problems_and_the_summary(monkeypatch):
    monkeypatch.setenv("HOME", "/home/dev")
    state = utc(mode="run", record="/home/dev/.local/state/vpnw/runs/r-36e0ba.jsonl")
    assert format_event(ev("run.start", {"mode": "run", "program": "a", "policy": None,
                                         "policy_file": None, "via": "direct", "dry_run": False,
                                         "allow_unix_sockets": False, "version": "0.1.0",
                                         "record": "x"}), state) is None
    assert format_event(ev("conn.request", {"door": "http", "kind": "http-connect",
                                            "host": "evil.example", "port": 443}, 5), state) is None
    assert format_event(ev("conn.open", {"address": "1.2.3.4", "port": 443, "via": "direct",
                                         "ms": 1}, 5), state) is None
    assert format_event(ev("policy.deny", {"rule": "r", "reason": "why", "enforced": True}, 5), state) \
        == "vpnw 11:44:36.244  #5     DENY   evil.example:443  why"
    assert format_event(ev("run.end", {"exit_code": 0, "connections": 12, "denied": 0,
                                       "would_deny": 0, "failed": 1, "ms": 900}), state) \
        == "vpnw  run r-36e0ba: 12 connections, 0 denied, 1 failed; exit 0; record ~/.local/state/vpnw/runs/r-36e0ba.jsonl"
    assert format_event(ev("run.end", {"exit_code": 0, "connections": 0, "denied": 0,
                                       "would_deny": 0, "failed": 0, "ms": 1}), utc(mode="quiet")) is None


def test_colour_only_on_the_verb():
    state = utc(color=True)
    format_event(ev("conn.request", {"door": "http", "kind": "http-connect", "host": "e.example",
                                     "port": 443}, 1), state)
    assert format_event(ev("policy.deny", {"rule": "r", "reason": "why", "enforced": True}, 1), state) \
        == "vpnw 11:44:36.244  #1     \x1b[31mDENY\x1b[0m   e.example:443  why"
    assert "\x1b[32mopen\x1b[0m" in format_event(ev("conn.open", {"address": "1.1.1.1", "port": 1,
                                                                  "via": "direct", "ms": 0}, 2), state)


def test_terminal_escapes_in_names_are_made_printable():
    state = utc()
    line = format_event(ev("conn.request", {"door": "http", "kind": "http-connect",
                                            "host": "a\x1b]0;pwned\x07b\u202e.example", "port": 443}, 1),
                        state)
    assert "\x1b" not in line and "\x07" not in line and "\u202e" not in line
    assert "a\\x1b]0;pwned\\x07b\\u202e.example:443" in line
    assert printable("ok\nnext") == "ok\\x0anext"


@pytest.mark.parametrize("n,text", [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (1234, "1.2 kB"),
                                    (999_949, "999.9 kB"), (999_950, "1.0 MB"),
                                    (3_400_000, "3.4 MB"), (5 * 10**12, "5.0 TB")])
def test_bytes(n, text):
    assert human_bytes(n) == text


def test_the_summary_names_the_last_digest_and_show_does_too():
    from stages.recorder.human import human_lines
    end = {"exit_code": 0, "connections": 0, "denied": 0, "would_deny": 0, "failed": 0, "ms": 1}
    digest = "ab" * 32
    state = utc(mode="run", record="-")
    state.digest = digest
    assert format_event(ev("run.end", end), state).endswith(f"; record on stdout; last digest {digest}")
    # read back from a run file (vpnw show): the digest the record's last line carries
    shown = list(human_lines([{**ev("run.end", end), "d": digest}], record="-"))
    assert shown[-1].endswith(f"; last digest {digest}")
    # a file of an older vpnw, without digests: no digest is named
    assert "digest" not in list(human_lines([ev("run.end", end)], record="-"))[-1]


@pytest.mark.parametrize("mode", ["trace", "run"])
def test_an_error_vpnw_says_itself_is_not_repeated_by_the_lines(mode):
    # Live, vpnw's own message carries the error on the same stream: the path
    # check's line and the summary do not repeat it (issue 28: the wrong-key
    # message was printed three times). `show` (nobody said it) says it once,
    # on the DOWN line, and the summary points there.
    error = "no handshake with 10.7.0.1:51820 within 3 s"
    down = ev("path.check", {"path": "office", "type": "wireguard", "ok": False, "ms": 3004.2,
                             "error": error})
    end = ev("run.end", {"exit_code": 123, "connections": 0, "denied": 0, "would_deny": 0,
                         "failed": 0, "ms": 3100, "error": f"the path 'office' is down: {error}; the program was not "
                                  "started (vpnw never falls back to a direct connection)"})
    live = utc(mode=mode, record="-", errors_said=True)
    lines = [format_event(down, live), format_event(end, live)]
    assert lines[0] == ("vpnw 11:44:36.244  path office DOWN  (3004 ms)" if mode == "trace" else None)
    assert lines[1].endswith("  run r-36e0ba: 0 connections, 0 denied, 0 failed; exit 123; "
                             "record on stdout"), lines
    replay = utc(mode=mode, record="-")
    assert format_event(down, replay) == f"vpnw 11:44:36.244  path office DOWN: {error}"
    assert "; error: the path 'office' is down (why: on its DOWN line above); the program" \
        in format_event(end, replay)
    shown = "\n".join(human_lines([down, end], record="-"))
    assert shown.count("no handshake") == 1, shown
    # a summary whose error is not the DOWN line's reason keeps it whole
    other = ev("run.end", {**end["fields"], "error": "the broker stopped; the program was not started"})
    assert "; error: the broker stopped; the program" in list(human_lines([down, other]))[-1]


@pytest.mark.parametrize("mode", ["trace", "run"])
def test_the_allow_rules_deny_private_refuses_are_said_once_at_the_start(mode):
    start = ev("run.start", {"mode": "guard", "program": "curl", "policy": "office",
                             "policy_file": "office.toml", "via": "direct", "record": "-",
                             "deny_private_shadows": {"set": "office.toml line 5",
                                                      "rules": ['"10.77.0.0/24" (line 7)',
                                                                '"*.internal" (line 8)'],
                                                      "unlisted": 2}})
    text = format_event(start, utc(mode=mode))
    note = text.splitlines()[-1]
    assert note == ('vpnw 11:44:36.244  note: deny_private = true (office.toml line 5) comes first '
                    'and refuses what allow rules "10.77.0.0/24" (line 7), "*.internal" (line 8), '
                    '2 more allow; set deny_private = false to let them through'), text
    assert format_event(start, utc(mode="quiet")) is None
    # --quiet: denials and the summary only (the README's promise), no note.
    assert format_event(start, utc(mode="denials")) is None
    scoped = ev("run.start", {**start["fields"], "deny_private_scope": "literals-and-names"})
    assert format_event(scoped, utc(mode="denials")) is None
    assert "resolves names at the exit" in format_event(scoped, utc(mode=mode))
    plain = ev("run.start", {k: v for k, v in start["fields"].items() if k != "deny_private_shadows"})
    assert "note" not in (format_event(plain, utc(mode=mode)) or "")


def test_a_unix_allow_that_names_a_command_socket_is_said_at_the_start():
    start = ev("run.start", {"mode": "guard", "program": "claude", "policy": "agent",
                             "policy_file": "agent.toml", "via": "direct", "record": "-",
                             "unix_allow": [{"entry": "$SSH_AUTH_SOCK", "path": "/tmp/ssh-x/agent.1"},
                                            {"entry": "/tmp/tmux-1000/default",
                                             "path": "/tmp/tmux-1000/default"}]})
    for mode in ("trace", "run"):
        note = format_event(start, utc(mode=mode)).splitlines()[-1]
        assert note == ("vpnw 11:44:36.244  note: [unix] allow names /tmp/tmux-1000/default "
                        "(tmux's server), which runs commands outside the sandbox for whoever "
                        "connects: the program can do through it what you can"), note
    assert format_event(start, utc(mode="denials")) is None
    harmless = ev("run.start", {**start["fields"], "unix_allow": start["fields"]["unix_allow"][:1]})
    assert "note" not in (format_event(harmless, utc(mode="run")) or "")

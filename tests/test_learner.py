"""The learner: flags, wildcard suggestions, bounded memory, hostile names, the command."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import tracemalloc

import pytest
from click.testing import CliRunner

from stages.learner.commands import learn_command
from stages.learner.draft import draft_policy
from stages.learner.generated_names import looks_generated, shannon_entropy
from stages.learner.learned import NoRuns
from stages.config.policy import parse_policy
from stages.record.events import encode, parse_line

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GOLDEN = os.path.join(HERE, "golden")


@pytest.mark.parametrize("label", [
    "api", "github", "pythonhosted", "files", "objects-origin", "githubusercontent",
    "googleusercontent", "us-east-1", "ec2-54-23-1-2", "registry", "internationalization",
    "github-production-release-asset-2e65be", "s3-accelerate", "login", "www2",
    "xn--bcher-kva", "dualstack", "cloudfront", "amazonaws", "storage",
])
def test_ordinary_labels_are_not_flagged(label):
    assert not looks_generated(label)


@pytest.mark.parametrize("label", [
    "mzxw6ytboi2dsmrsgq3dknzq",              # base32
    "4a6f686e20446f65206b6e6f7773",          # hex
    "dgvzdc10b2tlbi1hymnkzwy",               # base64, lowercased
    "d3kbcqa49mib13",                        # letters and digits mixed
    "qxvbzjtlpkwmrhgyadnfsc",                # random letters
    "aGVsbG8td29ybGQtc2VjcmV0LXRva2Vu",      # base64, case kept
])
def test_generated_labels_are_flagged(label):
    assert looks_generated(label)


def test_entropy():
    assert shannon_entropy("") == 0
    assert shannon_entropy("aaaa") == 0
    assert shannon_entropy("abcd") == 2.0


class Run:
    """A tiny builder of runs for these tests (the goldens are the realistic ones)."""

    def __init__(self, run="r-aaaaaa", mode="trace", program="agent"):
        self.run, self.conn, self.t = run, 0, 1_790_682_276_000_000_000
        self.events = [self.ev("run.start", None, mode=mode, program=program, policy=None,
                               policy_file=None, via="direct", dry_run=False,
                               allow_unix_sockets=False, version="0.1.0", record="-")]

    def ev(self, type_, conn, **fields):
        self.t += 1_000_000
        return parse_line(encode(self.run, type_, fields, path="direct", conn=conn, pid=1, ts_ns=self.t))

    def reach(self, host, port=443, address="140.82.112.6", up=10, down=20):
        self.conn += 1
        c = self.conn
        self.events += [self.ev("conn.request", c, door="http", kind="http-connect", host=host, port=port),
                        self.ev("conn.open", c, address=address, port=port, via="direct", ms=1),
                        self.ev("conn.close", c, bytes_up=up, bytes_down=down, ms=3)]
        return self

    def deny(self, host, port=443):
        self.conn += 1
        self.events += [self.ev("conn.request", self.conn, door="http", kind="http-connect",
                                host=host, port=port),
                        self.ev("policy.deny", self.conn, rule="default", reason="no rule", enforced=True)]
        return self


def allow_list(draft):
    return tomllib.loads(draft)["policy"]["allow"]


def test_ports_and_plain_hosts():
    run = Run().reach("a.example", 443).reach("a.example", 80).reach("b.example", 8443) \
        .reach("b.example", 443).reach("2001:db8::5", 8080, address="2001:db8::5").reach("c.example", 80)
    draft = draft_policy(run.events, "t")
    assert allow_list(draft) == ["a.example", "b.example", "b.example:8443", "c.example",
                                 "[2001:db8::5]:8080"]
    assert '"a.example",' in draft and "# 2 connections" in draft.split('"a.example",')[1].split("\n")[0]
    parse_policy(draft, "t.toml")


def test_denied_names_are_listed_commented_out_not_allowed():
    draft = draft_policy(Run().reach("ok.example").deny("evil.example").deny("evil.example").events, "t")
    assert allow_list(draft) == ["ok.example"]
    assert '    # "evil.example:443",  # denied 2 times: no rule' in draft
    assert "evil.example:443: denied 2 times" in draft.split("version = 1")[0]


def test_wildcard_suggestions():
    run = Run()
    for name in ("a.cdn.example.com", "b.cdn.example.com", "c.cdn.example.com", "www.example.com",
                 "x.other.org", "y.other.org", "one.co.uk", "two.co.uk", "three.co.uk"):
        run.reach(name)
    review = draft_policy(run.events, "t").split("version = 1")[0]
    assert "*.cdn.example.com could replace 3 names" in review
    assert "*.example.com could replace 4 names" in review
    assert "*.other.org" not in review          # two names only
    assert "*.co.uk" not in review              # a shared suffix, never a wildcard
    assert "do NOT use a wildcard" not in review


def test_a_wildcard_over_the_same_names_is_suggested_once():
    run = Run()
    for name in ("a.cdn.example.com", "b.cdn.example.com", "c.cdn.example.com"):
        run.reach(name)
    review = draft_policy(run.events, "t").split("version = 1")[0]
    assert "*.cdn.example.com could replace 3 names" in review
    assert "*.example.com could" not in review


def test_hostile_names_cannot_break_out_of_comments_or_strings():
    # A name is whatever the sandboxed program asked for; it must not inject TOML.
    run = Run().reach('x"]\nallow = ["*"]\n#.example').reach("ok.example")
    run.events[1]["fields"]["host"] = 'ok2.example'  # keep one well-formed
    run.deny('evil.example\n[policy]\ndefault = "allow"')
    draft = draft_policy(run.events, 'agent"\nname = "pwned')
    data = tomllib.loads(draft)
    assert data["policy"]["default"] == "deny"
    assert "*" not in data["policy"]["allow"]
    assert data["name"] == 'agent"\\x0aname = "pwned'
    assert "\ndefault = \"allow\"" not in draft


def test_memory_does_not_grow_with_the_record():
    def stream(n_conns):
        # The same 20 connections over and over (a number is reused only after
        # its connection closed), built once so the generator allocates nothing.
        yield Run().events[0]
        ts = "2026-09-29T11:44:36.000000000Z"
        cycle = []
        for c in range(1, 21):
            base = {"v": 1, "ts": ts, "run": "r-aaaaaa", "pid": 1, "path": "direct", "conn": c}
            cycle += [{**base, "type": "conn.request", "fields": {"door": "http", "kind": "http-connect",
                                                                  "host": f"h{c}.example", "port": 443}},
                      {**base, "type": "conn.open",
                       "fields": {"address": "140.82.112.6", "port": 443, "via": "direct", "ms": 1}},
                      {**base, "type": "conn.close", "fields": {"bytes_up": 100, "bytes_down": 200, "ms": 3}}]
        for i in range(n_conns * 3):
            yield cycle[i % len(cycle)]

    def peak(n_conns):
        tracemalloc.start()
        try:
            draft_policy(stream(n_conns), "big")
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small = peak(1_000)
    large = peak(66_667)       # 200,000 events
    assert large < 2_000_000, large
    assert large < small + 200_000, (small, large)


def test_no_run_is_an_error_not_an_empty_draft():
    # An empty draft would say "learned from 0 runs" and allow nothing.
    with pytest.raises(NoRuns):
        draft_policy([], "nothing")
    with pytest.raises(NoRuns):
        draft_policy(Run().reach("a.example").events[1:], "headless")


# --- the command -----------------------------------------------------------------

@pytest.fixture
def state(tmp_path):
    directory = tmp_path / "vpnw" / "runs"
    directory.mkdir(parents=True)
    shutil.copy(os.path.join(GOLDEN, "demo_agent_trace.jsonl"), directory / "r-36e0ba.jsonl")
    shutil.copy(os.path.join(GOLDEN, "pip_guard.jsonl"), directory / "r-7c01d2.jsonl")
    return tmp_path


def test_learn_reads_the_last_trace(state, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    result = CliRunner().invoke(learn_command, ["--name", "agent"])
    assert result.exit_code == 0
    with open(os.path.join(GOLDEN, "demo_agent_trace.toml"), encoding="utf-8") as f:
        assert result.output == f.read()   # the guard run (newer) is not a trace


def test_learn_with_no_trace_exits_121(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    result = CliRunner().invoke(learn_command, ["--name", "agent"])
    assert result.exit_code == 121
    assert "no trace to learn from" in result.output
    result = CliRunner().invoke(learn_command, ["--from", str(tmp_path / "missing.jsonl")])
    assert result.exit_code == 121 and "cannot read the run file" in result.output


def test_learn_from_several_files_and_stdin():
    files = [os.path.join(GOLDEN, n + ".jsonl") for n in ("dry_run_guard", "pip_guard")]
    result = CliRunner().invoke(learn_command, ["--name", "tools", "--from", files[0], "--from", files[1]])
    with open(os.path.join(GOLDEN, "merged.toml"), encoding="utf-8") as f:
        merged = f.read()
    assert result.exit_code == 0 and result.output == merged
    with open(files[1], "rb") as f:
        data = f.read()
    done = subprocess.run([sys.executable, "-m", "stages.learner", "--name", "tools", "--from", files[0],
                           "--from", "-"], input=data, capture_output=True, cwd=ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == merged


# --- files that are not run files (issue 12) ------------------------------------

NOT_RUN_FILES = {
    "passwd": (b"root:x:0:0:root:/root:/bin/bash\n", "its first line is not JSON"),
    "empty": (b"", "it is empty"),
    "blank": (b"\n  \n", "it is empty"),
    "version 2": (b'{"v":2,"ts":"2026-09-29T11:44:36.000000000Z","type":"run.start","run":"r-a",'
                  b'"pid":1,"path":null,"conn":null,"fields":{}}\n',
                  "its first line has record version 2; this vpnw reads version 1"),
    "json, not an event": (b'{"hello": "world"}\n', "its first line has record version None"),
    "no run.start": (encode("r-aaaaaa", "conn.request", {"door": "http", "kind": "http-connect",
                                                         "host": "a.example", "port": 443}, conn=1),
                     "its first event is conn.request, not run.start"),
}


@pytest.mark.parametrize("kind", sorted(NOT_RUN_FILES))
def test_learn_and_show_refuse_a_file_that_is_not_a_run(tmp_path, kind):
    from stages.recorder.commands import show_command
    data, why = NOT_RUN_FILES[kind]
    path = tmp_path / "not-a-run.jsonl"
    path.write_bytes(data)
    for command, args in ((learn_command, ["--from", str(path)]), (show_command, [str(path)]),
                          (show_command, ["--summary", str(path)])):
        result = CliRunner().invoke(command, args)
        assert result.exit_code == 121, (args, result.output)
        assert f"{path} is not a vpnw run file: {why}" in result.output
        assert "expected a vpnw run file: JSON Lines whose first line is a run.start event" in result.output
    done = subprocess.run([sys.executable, "-m", "stages.learner", "--from", "-"], input=data,
                          capture_output=True, cwd=ROOT, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 121
    assert f"stdin (--from -) is not a vpnw run file: {why}".encode() in done.stderr
    assert done.stdout == b""


def test_unix_refusals_are_suggested_commented_out_and_only_those_a_policy_can_name():
    from stages.learner.draft import draft_policy
    from stages.config.policy import parse_policy
    start = {"type": "run.start", "run": "r-1", "ts": "2026-01-01T00:00:00Z",
             "fields": {"mode": "trace", "program": "agent"}}

    def unix(type_, **f):
        return {"type": type_, "run": "r-1", "fields": {"process": 3, "program": "curl", **f}}
    events = [start,
              unix("unix.deny", path="/run/pg/.s.PGSQL.5432", reason="a socket bound outside the sandbox"),
              unix("unix.deny", path="/run/pg/.s.PGSQL.5432", reason="a socket bound outside the sandbox"),
              unix("unix.deny", path="/proc/self/root/x", reason="a path through a /proc link"),
              unix("unix.deny", path="@x11", reason="an abstract socket from a socket made outside the sandbox")]
    draft = draft_policy(events, "agent")
    assert '#     "/run/pg/.s.PGSQL.5432",  # 2 connects refused (curl)' in draft
    assert "/proc/self/root" not in draft and "@x11" not in draft
    assert parse_policy(draft).unix_allow == ()          # nothing applied
    head, unix_part = draft.split("# [unix]\n")
    uncommented = head + "[unix]\n" + "\n".join(l[2:] for l in unix_part.splitlines())
    assert parse_policy(uncommented).unix_allow == ("/run/pg/.s.PGSQL.5432",)


def test_a_socket_that_runs_commands_is_never_suggested():
    from stages.learner.draft import draft_policy
    from stages.config.policy import parse_policy
    start = {"type": "run.start", "run": "r-1", "ts": "2026-01-01T00:00:00Z",
             "fields": {"mode": "trace", "program": "claude"}}
    outside = "a socket bound outside the sandbox"

    def unix(type_, **f):
        return {"type": type_, "run": "r-1", "fields": {"process": 3, "program": "claude", **f}}
    draft = draft_policy([start, unix("unix.deny", path="/tmp/tmux-1000/default", reason=outside),
                          unix("unix.deny", path="/run/docker.sock", reason=outside),
                          unix("unix.deny", path="/run/user/1000/bus", reason=outside)], "agent")
    assert '"/tmp/tmux-1000/default"' not in draft and '"/run/docker.sock"' not in draft, draft
    assert "# [unix]" not in draft and "allow = [" not in draft.split("# Refused, and never")[1], draft
    assert "#   /tmp/tmux-1000/default: tmux's server (1 connect refused)" in draft, draft
    assert "#   /run/docker.sock: the Docker daemon (1 connect refused)" in draft, draft
    assert parse_policy(draft).unix_allow == ()


def test_a_trace_to_private_destinations_drafts_deny_private_false_and_keeps_the_path():
    # issue 28: learn through an office over WireGuard drafted deny_private = true
    # beside allow rules that very setting refuses, and a guard command without --config.
    from stages.broker.decide import decide, parse_target
    run = Run()
    run.events[0]["fields"].update(via="office", config="my paths.toml")
    run.reach("tracker.office.internal", 8471, address="10.66.0.1") \
        .reach("10.66.0.1", 8471, address="10.66.0.1").reach("pypi.org", 443, address="151.101.0.223")
    draft = draft_policy(run.events, "office")
    policy = parse_policy(draft, "office.toml")
    assert policy.deny_private is False, draft
    assert ("# The traced program reached private destinations (10.66.0.1:8471, "
            "tracker.office.internal:8471):\n# deny_private = true would refuse them before any "
            "allow rule below.\ndeny_private = false\n") in draft, draft
    assert "#   vpnw guard --config 'my paths.toml' --via office --policy office.toml -- PROGRAM\n" in draft
    for host, port in (("tracker.office.internal", 8471), ("10.66.0.1", 8471), ("pypi.org", 443)):
        verdict = decide(parse_target(host, port), policy, [parse_target("10.66.0.1", 1).ip])
        assert verdict.allowed, (host, verdict)      # the draft lets through what it allows


def test_metadata_loopback_and_documentation_addresses_keep_deny_private_true():
    run = Run().reach("metadata.google.internal", 80, address="169.254.169.254") \
        .reach("evil.example", 443, address="203.0.113.66").reach("127.0.0.1", 8080, address="127.0.0.1")
    draft = draft_policy(run.events, "t")
    assert parse_policy(draft, "t.toml").deny_private is True and "deny_private = false" not in draft
    assert "#   vpnw guard --policy t.toml -- PROGRAM\n" in draft
    assert "metadata.google.internal:80: the cloud metadata server's name" in draft


def test_held_writes_become_allow_write_suggestions_never_for_what_runs_later():
    from stages.learner.draft import draft_policy
    entry = lambda path, later=None: {"path": path, "kind": "file", "size": 1, "sha256": None,
                                      "runs_later": later}
    events = [{"type": "run.start", "run": "r-1", "ts": "2026-12-07T09:00:00.000000000Z",
               "fields": {"mode": "trace", "program": "sh"}},
              {"type": "files.held", "run": "r-1", "fields": {"count": 4, "truncated": False, "entries": [
                  entry("/home/u/.cache/pip/http/a"), entry("/home/u/.cache/pip/http/b"),
                  entry("/home/u/.bashrc", "shell start-up"), entry("/home/u/notes/x.txt"),
                  entry('/home/u/.x\nallow = ["*"]')]}}]
    text = draft_policy(events)
    lines = text.splitlines()
    assert '#     "/home/u/.cache/pip",  # 2 writes held' in lines
    assert '#     "/home/u/notes",  # 1 write held' in lines
    later = [line for line in lines if ".bashrc" in line]
    assert later == ['#     # "/home/u/.bashrc",  # 1 write held; runs later on its own (shell start-up): '
                     'what is planted there runs outside the sandbox']
    # A name the program chose stays inside its TOML string, in a comment.
    assert not any(line.startswith("allow") and "*" in line for line in lines)
    assert all(line.startswith("#") for line in lines[lines.index(later[0]) - 6:lines.index(later[0]) + 1])


# --- the machine's own loopback: the draft says what guard then does (issue 44) -------

def test_a_local_door_the_trace_used_is_kept_and_said_to_be_a_door_not_refused():
    run = Run()
    run.conn += 1
    run.events += [run.ev("conn.request", run.conn, door="local", kind="local", host="localhost", port=18941),
                   run.ev("policy.allow", run.conn, rule='allow "localhost:18941" (line 4)', reason="r",
                          host="localhost", port=18941, door="local"),
                   run.ev("conn.open", run.conn, address="127.0.0.1", port=18941, via="localhost", ms=1),
                   run.ev("conn.close", run.conn, bytes_up=1, bytes_down=2, ms=3)]
    draft = draft_policy(run.events, "t")
    policy = parse_policy(draft, "t.toml")
    assert "localhost:18941" in allow_list(draft) and policy.deny_private is True
    assert "deny_private = true refuses" not in draft, draft
    assert "localhost:18941: this machine's own service; the rule opens a door on port 18941" in draft
    # What guard does with it: the door opens, whatever deny_private says.
    from stages.config.policy import localhost_ports, localhost_rule
    assert localhost_ports(policy) == (18941,) and localhost_rule(policy, 18941) is not None


@pytest.mark.parametrize("asked", ["127.0.0.1", "localhost", "::1"])
def test_a_refused_loopback_destination_is_suggested_as_its_door_rule(asked):
    run = Run().deny(asked, 18942)
    draft = draft_policy(run.events, "t")
    assert '# "localhost:18942",  # denied 1 time: no rule; the rule localhost:18942 opens a door' in draft
    uncommented = draft.replace('# "localhost:18942",', '"localhost:18942",')
    from stages.config.policy import localhost_ports
    assert localhost_ports(parse_policy(uncommented, "t.toml")) == (18942,)


def test_the_ssh_agent_socket_is_drafted_as_the_variable():
    """Its path (/tmp/ssh-XXXX/agent.N) is made afresh at each login: a
    draft naming it is stale at the next; "$SSH_AUTH_SOCK" is read at each
    run's start."""
    from stages.learner.draft import draft_policy
    from stages.config.policy import parse_policy
    start = {"type": "run.start", "run": "r-1", "ts": "2026-01-01T00:00:00Z",
             "fields": {"mode": "trace", "program": "git"}}

    def refused(path):
        return {"type": "unix.deny", "run": "r-1", "fields": {
            "process": 3, "program": "ssh", "path": path, "reason": "a socket bound outside the sandbox"}}
    for events, env in (([refused("/tmp/ssh-XXXXqa1b2c/agent.1234")], None),
                        ([refused("/tmp/ssh-XXXXqa1b2c/agent.1234"), refused("/tmp/ssh-Yb3kkk9z/agent.99")],
                         "/tmp/ssh-Yb3kkk9z/agent.99"),
                        ([refused("/run/user/1000/keyring/ssh")], "/run/user/1000/keyring/ssh")):
        draft = draft_policy([start, *events], "git", ssh_auth_sock=env)
        assert f'#     "$SSH_AUTH_SOCK",  # {len(events)} connect' in draft, draft
        assert "/agent." not in draft and "keyring" not in draft, draft
        head, unix_part = draft.split("# [unix]\n")
        uncommented = head + "[unix]\n" + "\n".join(l[2:] for l in unix_part.splitlines())
        assert parse_policy(uncommented).unix_allow == ("$SSH_AUTH_SOCK",)
    # Another socket, or one at the variable's old value, keeps its path.
    draft = draft_policy([start, refused("/run/user/1000/keyring/ssh")], "git",
                         ssh_auth_sock="/tmp/ssh-XXXXqa1b2c/agent.1234")
    assert '"/run/user/1000/keyring/ssh"' in draft and "$SSH_AUTH_SOCK" not in draft, draft

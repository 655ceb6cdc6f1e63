"""The record through real runs, as root and as vpnwtest (docs/record.md).

- Privacy by construction: a secret carried by the program's arguments,
  environment, URL path and query, headers, cookie, body and the proxy
  password reaches the servers (controls) and appears nowhere in the record,
  on vpnw's stderr, or in what `vpnw show` and `vpnw runs` print.
- The recorder is replaceable: `--record FILE`, `--record -`, `--events-to`
  with a real external program; replaying a run file gives back the lines
  `vpnw trace` printed.
- Reading records: `vpnw runs`, `vpnw show [--summary] [--json]`, and which
  run "the last trace" and "the last run" are.
- Human lines: the documented layout, aligned, in local time, coloured only
  on a terminal without NO_COLOR.
"""
from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import tomllib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from e2e_support import complete_record, describe, run_files
from exits import _BUILDERS as EXIT_COMMANDS
from progs_support import prog_text

pytestmark = pytest.mark.world

MARKER = "Zq7MARKERx93k"
STATE_TZ = "Asia/Kolkata"   # UTC+05:30 all year: a shown time is easy to check
KOLKATA = timezone(timedelta(hours=5, minutes=30))


def the_record(state_home: Path) -> tuple[Path, list[dict]]:
    files = run_files(state_home)
    assert len(files) == 1, files
    return files[0], complete_record(files[0].read_bytes())


def vpnw_lines(stderr: str) -> list[str]:
    """The recorder's human lines among vpnw's stderr (`vpnw: ...` are messages)."""
    return [line for line in stderr.splitlines() if line.startswith("vpnw ")]


# ── privacy by construction ─────────────────────────────────────────────

# Every place a secret can ride: argv, environment, URL path and query, an
# Authorization header, a cookie, a request body; over both doors and both
# kinds of HTTP request.
PRIVACY_SCRIPT = prog_text("privacy.sh")


def start_microsocks(world, user_name: str, password: str):
    """A real microsocks exit in the world's namespace, with a password."""
    port = 20000 + (os.getpid() % 5000)
    workdir = world.workdir("root")
    command = EXIT_COMMANDS["microsocks"](str(workdir), port, user_name, password)
    proc = world.popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    world.run([sys.executable, "-c", prog_text("wait_for_port.py"), str(port)], check=True)
    return proc, port


def test_secrets_never_reach_the_record(world, user):
    exit_proc, port = start_microsocks(world, "vpnwuser", MARKER)
    try:
        config = world.file(f"paths-{user}.toml", f'''version = 1
name = "privacy"
[paths.exit]
type = "proxy"
url = "socks5://vpnwuser:{MARKER}@127.0.0.1:{port}"
''', mode=0o644)
        script = world.file("privacy.sh", PRIVACY_SCRIPT)
        web_before = len(world.web_log())
        r = world.vpnw(["trace", "--config", str(config), "--via", "exit", "--",
                        "sh", str(script), MARKER], user=user,
                       env={"SECRET_TOKEN": MARKER, "CA": str(world.ca_pem)})
        assert r.returncode == 0, describe(r)
        assert "done" in r.stdout
    finally:
        exit_proc.kill()
        exit_proc.wait()
    # Controls: the secret did leave, through the exit (which checked the
    # password), in the request line the server saw.
    served = world.web_log()[web_before:]
    assert any(f"/upload/{MARKER}?q={MARKER}" in line for line in served), served
    assert any(f"seed={MARKER}" in line for line in served), served

    path, events = the_record(r.state_home)
    opens = [e for e in events if e["type"] == "conn.open"]
    assert len(opens) == 3 and all(e["fields"]["via"] == "exit" for e in opens), opens
    assert {e["fields"]["kind"] for e in events if e["type"] == "conn.request"} == \
        {"http-forward", "http-connect", "socks5"}
    assert events[0]["fields"]["program"] == "sh"

    shown = {
        "run file": path.read_bytes().decode(),
        "vpnw stderr": r.stderr,
        "vpnw show": world.vpnw(["show"], user=user, state_home=r.state_home).stdout,
        "vpnw show --summary --json": world.vpnw(["show", "--summary", "--json"], user=user,
                                                 state_home=r.state_home).stdout,
        "vpnw runs --json": world.vpnw(["runs", "--json"], user=user, state_home=r.state_home).stdout,
    }
    assert r.state_home and all(shown.values()), shown
    leaks = [where for where, text in shown.items() if MARKER in text]
    assert leaks == [], leaks


# ── the recorder is replaceable ─────────────────────────────────────────

CURL_TWICE = ["sh", "-c", "curl -sS --max-time 30 -o /dev/null http://api.github.com/whoami && "
              "curl -sS --max-time 30 -o /dev/null --socks5-hostname 127.0.0.1:1080 "
              "http://pypi.world/whoami"]


def test_record_to_a_file_elsewhere(world, user):
    target = world.workdir(user) / "run.jsonl"
    r = world.vpnw(["run", "--record", str(target), "--", *CURL_TWICE], user=user)
    assert r.returncode == 0, describe(r)
    events = complete_record(target.read_bytes())
    assert events[0]["fields"]["record"] == str(target)
    assert events[-1]["fields"]["connections"] == 2
    assert target.stat().st_mode & 0o777 == 0o600
    assert run_files(r.state_home) == []


def test_record_to_stdout(world, user):
    r = world.vpnw(["run", "--record", "-", "--", *CURL_TWICE], user=user, text=False)
    assert r.returncode == 0, describe(r)
    events = complete_record(r.stdout)
    assert events[0]["fields"]["record"] == "-"
    assert events[-1]["fields"]["connections"] == 2
    assert b"record on stdout" in r.stderr
    assert run_files(r.state_home) == []


@pytest.mark.parametrize("sink", ["jq", "cat", "tee"])
def test_events_to_an_external_program(world, user, sink):
    out = world.workdir(user) / "sink.jsonl"
    command = {"jq": f"jq -c . > {out}", "cat": f"cat > {out}", "tee": f"tee {out} > /dev/null"}[sink]
    r = world.vpnw(["trace", "--events-to", command, "--", *CURL_TWICE], user=user)
    assert r.returncode == 0, describe(r)
    path, events = the_record(r.state_home)
    received = out.read_bytes()
    if sink == "jq":
        assert [json.loads(line) for line in received.splitlines()] == events
    else:
        assert received == path.read_bytes()


def test_replay_reproduces_the_trace_lines(world, user):
    env = {"TZ": STATE_TZ}
    r = world.vpnw(["trace", "--", *CURL_TWICE], user=user, env=env)
    assert r.returncode == 0, describe(r)
    path, events = the_record(r.state_home)
    printed = vpnw_lines(r.stderr)
    assert len(printed) >= 8, r.stderr
    with open(path) as stream:
        replay = world.run([sys.executable, "-m", "stages.recorder", "--color", "never"], user=user,
                           env=env, input=stream.read(), state_home=r.state_home)
    assert replay.returncode == 0, describe(replay)
    assert replay.stdout == ""
    # The live summary names the record file; the replay takes it from run.start.
    assert vpnw_lines(replay.stderr) == printed
    # show tells the events in the order their ts says (docs/record.md, "Order"):
    # the same lines, in time order (the file's may differ when writers raced).
    shown = world.vpnw(["show", events[0]["run"]], user=user, env=env, state_home=r.state_home)
    in_time = [e["ts"] for e in sorted(events, key=lambda e: e["ts"])]
    assert sorted(shown.stdout.splitlines()) == sorted(printed), shown.stdout
    if [e["ts"] for e in events] == in_time:
        assert shown.stdout.splitlines() == printed


# ── reading records back ────────────────────────────────────────────────

GUARD_POLICY = '''version = 1
name = "pypi-only"
[policy]
default = "deny"
deny_private = true
allow = ["pypi.world"]
'''


def test_runs_show_and_which_run_is_last(world, user):
    state = world.state_home(user)
    policy = world.file("pypi-only.toml", GUARD_POLICY)

    def curl(url):
        return ["curl", "-sS", "--max-time", "30", "-o", "/dev/null", url]

    trace = world.vpnw(["trace", "--", *curl("http://api.github.com/bytes/1000")], user=user, state_home=state)
    run = world.vpnw(["run", "--", *curl("http://github.com/whoami")], user=user, state_home=state)
    guard = world.vpnw(["guard", "--policy", str(policy), "--", "sh", "-c",
                        "curl -sS --max-time 30 -o /dev/null http://pypi.world/whoami; "
                        "curl -sS --max-time 30 -o /dev/null http://evil.example/; true"],
                       user=user, state_home=state)
    assert (trace.returncode, run.returncode, guard.returncode) == (0, 0, 120), \
        describe(trace) + describe(run) + describe(guard)
    ids = {}
    for path in run_files(state):
        events = complete_record(path.read_bytes())
        ids[events[0]["fields"]["mode"]] = events[0]["run"]
    assert set(ids) == {"trace", "run", "guard"}

    listed = json.loads(world.vpnw(["runs", "--json"], user=user, state_home=state).stdout)
    assert [(x["id"], x["mode"], x["program"], x["connections"], x["denied"], x["exit_code"])
            for x in listed] == [(ids["guard"], "guard", "sh", 2, 1, 120),
                                 (ids["run"], "run", "curl", 1, 0, 0),
                                 (ids["trace"], "trace", "curl", 1, 0, 0)]
    table = world.vpnw(["runs"], user=user, state_home=state).stdout.splitlines()
    assert table[0].split() == ["RUN", "START", "(UTC)", "MODE", "PROGRAM", "CONNS", "DENIED", "FAILED", "EXIT",
                                "HELD", "LEDGER"]
    rows = [line.split() for line in table[1:]]
    assert [(row[0], row[3], row[4], row[5], row[6], row[-3], row[-1]) for row in rows] == [
        (ids["guard"], "guard", "sh", "2", "1", "120", "ok"),
        (ids["run"], "run", "curl", "1", "0", "0", "ok"),
        (ids["trace"], "trace", "curl", "1", "0", "0", "ok")]

    # "The last run" is the guard; "the last trace", which learn reads, is the trace.
    newest = world.vpnw(["show"], user=user, state_home=state).stdout
    assert f"run {ids['guard']}" in newest and "DENY" in newest and "evil.example:80" in newest
    draft = world.vpnw(["learn", "--name", "agent"], user=user, state_home=state)
    assert draft.returncode == 0, describe(draft)
    assert ids["trace"] in draft.stdout and ids["run"] not in draft.stdout
    assert tomllib.loads(draft.stdout)["policy"]["allow"] == ["api.github.com"]

    summary = world.vpnw(["show", ids["guard"], "--summary"], user=user, state_home=state).stdout.splitlines()
    assert summary[0].split() == ["HOST", "PORT", "DECISION", "CONNS", "UP", "DOWN"]
    rows = {line.split()[0]: line.split() for line in summary[1:]}
    assert rows["evil.example"][1:4] == ["80", "denied", "1"]
    assert rows["pypi.world"][1:4] == ["80", "allowed", "1"]
    as_json = json.loads(world.vpnw(["show", ids["trace"][2:], "--summary", "--json"], user=user,
                                    state_home=state).stdout)
    assert as_json["run"]["id"] == ids["trace"]
    [dest] = as_json["destinations"]
    assert (dest["host"], dest["port"], dest["decision"], dest["requests"]) == ("api.github.com", 80, "allowed", 1)
    # The response carried the 1,000 bytes asked for, plus its headers.
    assert dest["bytes_down"] > 1000 and dest["bytes_up"] > 0


# ── human lines ─────────────────────────────────────────────────────────

TIME = r"(\d\d:\d\d:\d\d\.\d{3})"
REQUEST_RE = re.compile(rf"^vpnw {TIME}  #(\d+) +→ (\S+):(\d+)  (http-connect|http-forward|socks5)$")
DNS_RE = re.compile(rf"^vpnw {TIME}  #(\d+) +  dns  (\S+) → (.+)  \((\d+) ms\)$")
OPEN_RE = re.compile(rf"^vpnw {TIME}  #(\d+) +  open  (\S+) via (\S+)  \((\d+) ms\)$")
CLOSE_RE = re.compile(rf"^vpnw {TIME}  #(\d+) +  close  ↑(\d+(?:\.\d)? k?B) ↓(\d+(?:\.\d)? [kMG]?B)  \((\d+) ms\)$")
DENY_RE = re.compile(rf"^vpnw {TIME}  #(\d+) +  DENY   (\S+):(\d+)  (.+)$")
CONN_LINE_TYPES = [(REQUEST_RE, "conn.request"), (DNS_RE, "dns.resolve"), (OPEN_RE, "conn.open"),
                   (CLOSE_RE, "conn.close"), (DENY_RE, "policy.deny")]
# The first column after "vpnw HH:MM:SS.mmm  #N..." : the arrow, then the step words.
ARROW_COLUMN = len("vpnw 14:44:36.244  #1   ")
STEP_COLUMN = ARROW_COLUMN + 2

TRACE_POLICY = '''version = 1
name = "github-only"
[policy]
default = "deny"
deny_private = true
allow = ["api.github.com", "dual.world"]
'''


def local_clock(ts: str) -> str:
    """An event's RFC 3339 UTC time as HH:MM:SS.mmm in Asia/Kolkata (truncated, as shown)."""
    whole, frac = ts.rstrip("Z").split(".")
    moment = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return moment.astimezone(KOLKATA).strftime("%H:%M:%S") + "." + frac[:3]


def test_trace_lines_format_alignment_and_local_time(world, user):
    policy = world.file("github-only.toml", TRACE_POLICY)
    # curl's own complaints go to /dev/null: the program shares vpnw's stderr,
    # and a curl message written in pieces could land inside a line of ours.
    r = world.vpnw(["trace", "--policy", str(policy), "--", "sh", "-c",
                    "curl -sS --max-time 30 -o /dev/null http://api.github.com/bytes/2000 2>/dev/null; "
                    f"curl -sS --max-time 30 -o /dev/null --cacert {world.ca_pem} https://dual.world/whoami 2>/dev/null; "
                    "curl -sS --max-time 30 -o /dev/null --socks5-hostname 127.0.0.1:1080 http://evil.example/ 2>/dev/null; true"],
                   user=user, env={"TZ": STATE_TZ})
    assert r.returncode == 120, describe(r)
    _, events = the_record(r.state_home)
    assert "\x1b[" not in r.stderr   # stderr is a pipe here: no colour
    by_key = {}
    for event in events:
        if event["conn"] is not None:
            by_key.setdefault((event["type"], event["conn"]), event)

    matched = {kind: [] for _, kind in CONN_LINE_TYPES}
    for line in vpnw_lines(r.stderr):
        for regex, kind in CONN_LINE_TYPES:
            m = regex.match(line)
            if m:
                conn = int(m.group(2))
                event = by_key[(kind, conn)]
                assert m.group(1) == local_clock(event["ts"]), (line, event["ts"])
                column = line.index("→") if kind == "conn.request" else len(line) - len(line[ARROW_COLUMN:].lstrip())
                assert column == (ARROW_COLUMN if kind == "conn.request" else STEP_COLUMN), line
                matched[kind].append((conn, m.groups()[2:]))
                break
    requests = [e for e in events if e["type"] == "conn.request"]
    assert len(matched["conn.request"]) == len(requests) == 3
    assert [g for _, g in matched["conn.request"]] == [
        ("api.github.com", "80", "http-forward"), ("dual.world", "443", "http-connect"),
        ("evil.example", "80", "socks5")]
    opens = [g[:2] for _, g in matched["conn.open"]]
    assert opens[0] == ("140.82.112.6", "direct") and len(opens) == 2 and opens[1][1] == "direct", opens
    assert len(matched["conn.close"]) == 2
    [(_, deny)] = matched["policy.deny"]
    assert deny[:2] == ("evil.example", "80") and "evil.example" in deny[2]
    # The summary closes the trace, with a time too.
    assert re.match(rf"^vpnw {TIME}  run r-[0-9a-f]{{12}}: 3 connections, 1 denied, 0 failed; exit 120; record ",
                    vpnw_lines(r.stderr)[-1]), r.stderr


def stderr_on_a_terminal(world, user, args, env) -> bytes:
    """vpnw's stderr when it is a terminal (a pty we hold the other side of)."""
    leader, follower = pty.openpty()
    try:
        proc = world.popen([str(world.vpnw_path), *args], user=user, env=env,
                           stdout=subprocess.DEVNULL, stderr=follower)
        os.close(follower)
        follower = None
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:   # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=60) == 0, seen
        return seen
    finally:
        if follower is not None:
            os.close(follower)
        os.close(leader)


@pytest.mark.parametrize("no_color", [False, True], ids=["terminal", "NO_COLOR"])
def test_colour_only_on_a_terminal_without_no_color(world, user, no_color):
    env = {"TERM": "xterm", **({"NO_COLOR": "1"} if no_color else {})}
    seen = stderr_on_a_terminal(world, user, ["trace", "--", "curl", "-sS", "--max-time", "30",
                                              "-o", "/dev/null", "http://api.github.com/whoami"], env)
    text = seen.decode("utf-8", "replace")
    assert " open " in text.replace("\x1b[32m", " ").replace("\x1b[0m", " "), text
    if no_color:
        # No colour. Resets stay: each of vpnw's lines begins with the one that
        # keeps it readable whatever the program left set, and the terminal's
        # modes are put back when the program ends (docs/security.md).
        import re
        assert set(re.findall(r"\x1b\[([0-9;]*)m", text)) <= {"0", ""}, text
    else:
        assert "\x1b[32mopen\x1b[0m" in text, text

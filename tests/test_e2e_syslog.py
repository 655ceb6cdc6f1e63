"""--syslog into a real rsyslogd (Debian's), in the test world, as root and
as vpnwtest.

Each test starts its own rsyslogd (tests/rsyslog_support.py) on a socket
path and loopback ports of the world namespace, never the machine's
/dev/log, with mmjsonparse and a template that writes what it parsed to a
file. The tests read that file:

- every event of a run arrives, parsed, fields intact, over /dev/log-style
  Unix datagrams, UDP and TCP (octet-counted), with the RFC 5424 header
  fields vpnw promises; denials of hostile names (quotes, backslashes,
  newlines, a forged syslog header, 255 bytes) included;
- a 2,000-connection run: nothing lost, every connection's events in order;
- a dead target (nobody listening) and a stuck one (a socket nobody reads)
  never stall the run, and what they lost is counted in run.end;
- no secret reaches any format on any transport (privacy marker);
- the fleet recipe of docs/record.md: two machines' rsyslogs forward to a
  central one, and one jq query there finds every denial of both.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from e2e_support import describe
from rsyslog_support import Rsyslog
from stages.recorder.shipping.outcomes import severity

pytestmark = pytest.mark.world

HERE = Path(__file__).resolve().parent
PYTHON = "/usr/bin/python3"

HOSTILE = ['ev"il\\host.example', "new\nline.example", "cr\r\n<13>1 2026-01-01T00:00:00Z forged vpnw - - - @cee:{}",
           "x" * 200 + ".example" + "y" * 47]
POLICY = '''version = 1
name = "syslog-test"
[policy]
default = "deny"
allow = ["api.github.com"]
'''


def agent(world) -> str:
    return str(world.file("socks_agent.py", (HERE / "progs" / "socks_agent.py").read_bytes()))


def plan(*items) -> str:
    return json.dumps([list(item) for item in items])


def the_record(state_home: Path) -> list[dict]:
    files = sorted((state_home / "vpnw" / "runs").glob("*.jsonl"))
    assert len(files) == 1, files
    data = files[0].read_bytes()
    assert data.endswith(b"\n")
    events = [json.loads(line) for line in data.splitlines()]
    assert events[0]["type"] == "run.start" and events[-1]["type"] == "run.end"
    return events


def by_conn(events):
    out = defaultdict(list)
    for e in events:
        out[e["conn"]].append(e)
    return out


def port_for(world, n: int) -> int:
    return 21000 + n


def target_of(rs: Rsyslog, transport: str) -> str:
    return {"unix": str(rs.socket), "udp": f"udp://127.0.0.1:{rs.udp_port}",
            "tcp": f"tcp://127.0.0.1:{rs.tcp_port}"}[transport]


@pytest.fixture
def rsyslog(world, request):
    made = []

    def start(name="collector", **kw):
        kw.setdefault("udp_port", port_for(world, 2 * len(made) + 1))
        kw.setdefault("tcp_port", port_for(world, 2 * len(made) + 2))
        rs = Rsyslog(world, f"{name}-{os.getpid()}-{len(made)}-{request.node.name[-40:]}".replace("[", "-")
                     .replace("]", "").replace("/", "-"), **kw)
        made.append(rs)
        return rs.start()
    yield start
    for rs in made:
        rs.stop()


@pytest.mark.parametrize("transport", ["unix", "udp", "tcp"])
def test_every_event_reaches_rsyslog_parsed(world, user, rsyslog, transport):
    rs = rsyslog()
    policy = world.file("syslog-policy.toml", POLICY)
    r = world.vpnw(["guard", "--policy", str(policy), "--syslog", target_of(rs, transport), "--",
                    PYTHON, agent(world), plan(("api.github.com", 80, 2), *((h, 443, 1) for h in HOSTILE),
                                               ("evil.example", 443, 1))], user=user)
    assert r.returncode == 120, describe(r)
    events = the_record(r.state_home)
    assert events[-1]["fields"]["syslog_lost"] == 0, events[-1]
    asked = [e["fields"]["host"] for e in events if e["type"] == "conn.request"]
    assert asked[2:6] == [h[:255] for h in HOSTILE], asked
    denied = [e for e in events if e["type"] == "policy.deny"]
    assert len(denied) == 5

    records = rs.await_records(lambda got: len(got) >= len(events))
    assert rs.unparsed() == ""
    docs = [rec["doc"] for rec in records]
    # Everything, fields intact, nothing else; over UDP too (loopback, a short run).
    assert sorted(map(json.dumps, docs)) == sorted(map(json.dumps, events))
    for conn, evs in by_conn(events).items():
        assert by_conn(docs)[conn] == evs
    start = events[0]
    for rec in records:
        event = rec["doc"]
        assert rec["app"] == "vpnw" and rec["procid"] == str(start["pid"])
        assert int(rec["severity"]) == severity(event) and rec["facility"] == "1"
        if transport == "unix":
            assert rec["msgid"] == "-"          # the local format has none; rsyslog names the host
        else:
            assert rec["msgid"] == event["type"]
            assert rec["hostname"] == socket.gethostname()
    assert {int(rec["severity"]) for rec in records if rec["doc"]["type"] == "policy.deny"} == {4}
    # The hostile names are data: no forged message, every host intact.
    assert [rec["doc"]["fields"]["host"] for rec in records if rec["doc"]["type"] == "conn.request"] == asked


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_2000_connections_nothing_lost_order_kept(world, user, rsyslog, transport):
    rs = rsyslog()
    r = world.vpnw(["run", "--syslog", target_of(rs, transport), "--",
                    PYTHON, agent(world), plan(("api.github.com", 80, 2000))], user=user, timeout=600)
    assert r.returncode == 0, describe(r)
    assert r.stdout.count("ok") == 2000
    events = the_record(r.state_home)
    assert events[-1]["fields"]["connections"] == 2000
    assert events[-1]["fields"]["syslog_lost"] == 0, events[-1]
    records = rs.await_records(lambda got: len(got) >= len(events), timeout=120)
    docs = [rec["doc"] for rec in records]
    assert len(docs) == len(events)
    got = by_conn(docs)
    for conn, evs in by_conn(events).items():
        assert got[conn] == evs, conn


@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_a_dead_target_never_stalls_the_run_and_its_losses_are_counted(world, user, transport):
    # Nobody listens on that port: the connection (TCP) or each datagram (UDP) is refused.
    r = world.vpnw(["run", "--syslog", f"{transport}://127.0.0.1:9", "--",
                    PYTHON, agent(world), plan(("api.github.com", 80, 20))], user=user)
    assert r.returncode == 0, describe(r)
    assert r.stdout.count("ok") == 20
    events = the_record(r.state_home)
    lost = events[-1]["fields"]["syslog_lost"]
    if transport == "tcp":
        # Every message but run.end's own (sent after the count) was lost, and counted.
        assert lost == len(events) - 1
        assert "syslog tcp://127.0.0.1:9 stopped taking messages" in r.stderr
    else:
        # Each refusal (the ICMP answer to an earlier datagram) costs the datagram
        # being sent, and is counted; the copy goes on with the next one.
        assert 0 < lost < len(events) - 1


@pytest.mark.timeout(600)   # the run is allowed 300 s
def test_a_stuck_target_never_stalls_the_run_and_its_losses_are_counted(world, user):
    # A socket nobody reads: its queue fills after a few datagrams.
    path = world.tmp / f"stuck-{user}-{os.getpid()}.sock"
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stuck.bind(str(path))
    path.chmod(0o777)
    try:
        r = world.vpnw(["run", "--syslog", str(path), "--",
                        PYTHON, agent(world), plan(("api.github.com", 80, 300))], user=user, timeout=300)
        assert r.returncode == 0, describe(r)
        assert r.stdout.count("ok") == 300
        events = the_record(r.state_home)
        lost = events[-1]["fields"]["syslog_lost"]
        stuck.setblocking(False)
        delivered = []
        while True:
            try:
                delivered.append(stuck.recv(65536))
            except BlockingIOError:
                break
    finally:
        stuck.close()
        path.unlink()
    assert lost > 0 and delivered
    # Everything is accounted for: what the socket holds plus what was counted
    # lost is every message, run.end's own aside (it is sent after the count).
    # The chain's heads go only to a copy that keeps up, uncounted (docs/record.md).
    delivered = [d for d in delivered if b'"vpnw_chain"' not in d]
    assert len(delivered) + lost in (len(events) - 1, len(events))
    assert all(m.startswith(b"<") and b"@cee:{" in m for m in delivered)


def test_no_secret_reaches_any_format_on_any_transport(world, user, rsyslog, tmp_path):
    from test_e2e_record import MARKER, PRIVACY_SCRIPT, start_microsocks
    rs = rsyslog()
    exit_proc, port = start_microsocks(world, "vpnwuser", MARKER)
    config = world.file(f"syslog-paths-{user}.toml", f'''version = 1
name = "privacy"
[paths.exit]
type = "proxy"
url = "socks5://vpnwuser:{MARKER}@127.0.0.1:{port}"
''')
    script = world.file("privacy.sh", PRIVACY_SCRIPT)
    outputs = world.workdir(user)
    shown = {}
    try:
        for transport, fmt in (("unix", "jsonl"), ("udp", "ocsf"), ("tcp", "ecs")):
            copy = outputs / f"events-to-{fmt}.jsonl"
            before = len(rs.records())
            r = world.vpnw(["trace", "--config", str(config), "--via", "exit",
                            "--syslog", target_of(rs, transport), "--events-format", fmt,
                            "--events-to", f"cat > {copy}", "--",
                            "sh", str(script), MARKER], user=user,
                           env={"SECRET_TOKEN": MARKER, "CA": str(world.ca_pem)})
            assert r.returncode == 0 and "done" in r.stdout, describe(r)
            events = the_record(r.state_home)
            assert len([e for e in events if e["type"] == "conn.open"]) == 3
            wanted = len(events) if fmt == "jsonl" else 6        # 3 opens + 3 closes
            records = rs.await_records(lambda got: len(got) >= before + wanted)
            assert len(records) == before + wanted, (transport, fmt)
            shown[f"syslog {transport} {fmt}"] = json.dumps(records[before:])
            shown[f"--events-to {fmt}"] = copy.read_text()
            assert len(shown[f"--events-to {fmt}"].splitlines()) == wanted
            for show_fmt in ("ocsf", "ecs"):
                out = world.vpnw(["show", "--format", show_fmt], user=user, state_home=r.state_home)
                assert out.returncode == 0 and len(out.stdout.splitlines()) == 6, describe(out)
                shown[f"show --format {show_fmt} ({transport})"] = out.stdout
    finally:
        exit_proc.kill()
        exit_proc.wait()
    shown["rsyslog unparsed"] = rs.unparsed()
    assert shown["rsyslog unparsed"] == ""
    leaks = [where for where, text in shown.items() if MARKER in text]
    assert leaks == [], leaks


def fleet_query() -> str:
    """The jq program of docs/record.md's fleet recipe, as written there."""
    doc = (HERE.parent / "docs" / "record.md").read_text()
    start = doc.index("jq -c '", doc.index("### A fleet")) + len("jq -c '")
    return doc[start:doc.index("'", start)]


def test_fleet_recipe_one_query_finds_every_denial_of_every_machine(world, user, rsyslog):
    central = rsyslog("central", unix=False, udp_port=None)
    machines = {name: rsyslog(name, hostname=name, udp_port=None, tcp_port=None,
                              forward_to=central.tcp_port)
                for name in ("machine-a", "machine-b")}
    policy = world.file("syslog-policy.toml", POLICY)
    expected = []
    for name, rs in machines.items():
        denied_hosts = [f"{name}-exfil.example", "evil.example"]
        r = world.vpnw(["guard", "--policy", str(policy), "--syslog", str(rs.socket),
                        "--events-format", "ocsf", "--",
                        PYTHON, agent(world), plan(("api.github.com", 80, 1),
                                                   *((h, 443, 1) for h in denied_hosts))], user=user)
        assert r.returncode == 120, describe(r)
        events = the_record(r.state_home)
        assert events[-1]["fields"]["syslog_lost"] == 0
        reasons = {e["conn"]: e["fields"]["reason"] for e in events if e["type"] == "policy.deny"}
        hosts = {e["conn"]: e["fields"]["host"] for e in events if e["type"] == "conn.request"}
        expected += [{"machine": name, "host": hosts[c], "reason": reasons[c]} for c in sorted(reasons)]
    # Every machine's outcomes (2 allowed: open, close; 2 refused) reach the centre.
    central.await_records(lambda got: len(got) >= 8)
    query = subprocess.run(["jq", "-c", fleet_query(), str(central.parsed_file)],
                           capture_output=True, text=True, check=True)
    found = [json.loads(line) for line in query.stdout.splitlines()]
    assert sorted(found, key=json.dumps) == sorted(expected, key=json.dumps)
    assert {f["machine"] for f in found} == {"machine-a", "machine-b"}

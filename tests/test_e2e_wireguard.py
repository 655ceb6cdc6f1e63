"""The WireGuard path end to end: a real wireguard-go peer (Debian's) in an
"office" namespace of the test world (world.exit_site, 10.7.0.1), reachable
only over UDP from the world; behind it, on the tunnel's far side
(10.66.0.1), a web server that exists only there. vpnw's own wireguard-go
runs in a path namespace vpnw makes; the world's routes never change.

What proves the path: the office web server's log shows the tunnel address
10.66.0.2 as the peer, and nothing in the world routes to 10.66.0.0/24, so a
direct connection could not reach it at all.
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from e2e_support import assert_every_connection_accounted, describe, run_events
from stages.record.check import check_run
from wg_support import CORP, INTERNAL, OUR_TUNNEL, PEER_TUNNEL, SITE, WEB, WEB_PORT, office_of
from world import DEMO_PACKAGE, DEMO_VALUE, GIT_README, WORLD_V4

GITHUB = "140.82.112.6"       # a public address; the world's internet answers for it

pytestmark = pytest.mark.world

@pytest.fixture(scope="module")
def office(world):
    return office_of(world)


def _secrets(office) -> list[str]:
    return [office.our_key, office.wrong_key, office.peer_key,
            office.our_key[:20], bytes.fromhex(_hex(office.our_key)).hex()]


def _hex(key: str) -> str:
    import base64
    return base64.b64decode(key).hex()


def assert_no_key(office, *texts: str) -> None:
    for text in texts:
        for secret in _secrets(office):
            assert secret not in text


def test_http_through_both_doors_reaches_the_office_over_the_tunnel(world, office, user):
    before = len(office.web_log())
    url = f"http://{PEER_TUNNEL}:{WEB_PORT}"
    r = world.vpnw(["run", "--config", str(office.config), "--via", "office", "--", "sh", "-c",
                    f"curl -sS --max-time 20 {url}/hello.txt; "
                    f"curl -sS --max-time 20 --noproxy '' --socks5-hostname 127.0.0.1:1080 {url}/blob.bin "
                    "| sha256sum"], user=user, timeout=120)
    assert r.returncode == 0, describe(r)
    blob = (office.dir / "www" / "blob.bin").read_bytes()
    import hashlib
    assert r.stdout.splitlines()[0] == "hello from the office"
    assert r.stdout.splitlines()[1].split()[0] == hashlib.sha256(blob).hexdigest()
    events = run_events(r)
    by_conn = assert_every_connection_accounted(events)
    opens = [e for e in events if e["type"] == "conn.open"]
    assert len(opens) == 2 and all(e["fields"]["via"] == "office" for e in opens), opens
    assert check_run(events) == [], check_run(events)
    check = [e for e in events if e["type"] == "path.check"]
    assert check[0]["fields"]["ok"] is True and check[0]["fields"]["type"] == "wireguard", check
    seen = office.web_log()[before:]
    assert len([line for line in seen if "GET /" in line]) == 2, seen
    assert all(line.startswith(OUR_TUNNEL + " ") for line in seen if "GET /" in line), seen
    record = b"".join(f.read_bytes() for f in r.run_files()).decode()
    assert_no_key(office, r.stdout, r.stderr, record)
    assert len(by_conn) == 2


def test_the_world_itself_cannot_reach_the_office_web_server(world, office):
    # The control for the test above: without the tunnel there is no way there.
    r = world.run(["curl", "-sS", "--max-time", "3", "--noproxy", "*",
                   f"http://{PEER_TUNNEL}:{WEB_PORT}/hello.txt"])
    assert r.returncode != 0 and "hello" not in r.stdout


def test_guard_applies_the_policy_over_the_tunnel(world, office, user):
    policy = world.file("wg-policy.toml", 'version = 1\nname = "agent"\n\n[policy]\n'
                        'default = "deny"\nallow = ["10.66.0.1/32:8471"]\n')
    url = f"http://{PEER_TUNNEL}:{WEB_PORT}/hello.txt"
    r = world.vpnw(["guard", "--config", str(office.config), "--via", "office", "--policy", str(policy),
                    "--", "sh", "-c", f"curl -sS --max-time 20 {url}; "
                    f"curl -sS -o /dev/null -w '%{{http_code}}\\n' http://10.66.0.1:8472/"],
                   user=user, timeout=120)
    assert r.returncode == 120, describe(r)
    assert r.stdout.splitlines() == ["hello from the office", "403"], describe(r)
    events = run_events(r)
    assert [e["type"] for e in events if e["type"] in ("conn.open", "policy.deny")] == \
        ["conn.open", "policy.deny"]


@pytest.mark.parametrize("path", ["wrong", "dead"])
def test_no_handshake_is_123_and_the_program_never_runs(world, office, user, path):
    marker = world.workdir(user) / f"wg-ran-{path}"
    r = world.vpnw(["run", "--config", str(office.config), "--via", path, "--", "touch", str(marker)],
                   user=user, env={"VPNW_WG_HANDSHAKE_TIMEOUT": "3"}, timeout=120)
    assert r.returncode == 123, describe(r)
    assert not marker.exists()
    assert f"no handshake with {SITE}:" in r.stderr, describe(r)
    assert check_run(run_events(r)) == []
    record = b"".join(f.read_bytes() for f in r.run_files()).decode()
    assert_no_key(office, r.stdout, r.stderr, record)


@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_every_process_of_the_path_ends_with_the_run(world, office, user, ending):
    work = world.workdir(user)
    started, go_on = work / f"wg-started-{ending}", work / f"wg-end-{ending}"
    for marker in (started, go_on):
        marker.unlink(missing_ok=True)
    proc = world.popen([str(world.vpnw_path), "run", "--config", str(office.config), "--via", "office",
                        "--", "sh", "-c", f"touch {started}; while [ ! -e {go_on} ]; do sleep 0.05; done"],
                       user=user, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert started.exists(), proc.communicate(timeout=30)
        ours = {p: cmd for p in _descendants(proc.pid) if (cmd := _cmdline(p)) is not None}
        path_pids = [p for p, cmd in ours.items()
                     if cmd.startswith(b"wireguard-go\0") or b"stages.broker.wireguard.path_process" in cmd]
        assert len(path_pids) == 2, ours
        for pid in path_pids:      # the keys go over a socket and UAPI, never argv or environment
            with open(f"/proc/{pid}/environ", "rb") as f:
                assert_no_key(office, ours[pid].decode("latin-1"), f.read().decode("latin-1"))
        if ending == "sigkill":
            os.kill(proc.pid, 9)
        else:
            go_on.touch()
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (-9 if ending == "sigkill" else 0)
    for _ in range(400):       # the kernel ends them (PDEATHSIG, EOF); wait for that, bounded
        alive = [p for p in path_pids if _running(p)]
        if not alive:
            break
        time.sleep(0.05)
    assert not alive, alive
    assert "vpnw0" not in world.run(["ip", "-o", "link"]).stdout
    assert not os.path.exists("/run/wireguard/vpnw0.sock")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def _descendants(pid: int) -> list[int]:
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            children += [int(c) for c in open(f"/proc/{pid}/task/{task}/children").read().split()]
        except FileNotFoundError:
            pass
    return children + [d for c in children for d in _descendants(c)]


def test_a_tunnel_killed_mid_run_fails_new_connections_path_down(world, office, user):
    work = world.workdir(user)
    first, second = work / "wg-first-done", work / "wg-go-on"
    for marker in (first, second):
        marker.unlink(missing_ok=True)
    url = f"http://{PEER_TUNNEL}:{WEB_PORT}/hello.txt"
    proc = world.popen([str(world.vpnw_path), "run", "--config", str(office.config), "--via", "office",
                        "--", "sh", "-c", f"curl -sS --max-time 20 {url}; touch {first}; "
                        f"while [ ! -e {second} ]; do sleep 0.05; done; "
                        f"curl -sS --max-time 20 -o /dev/null -w '%{{http_code}}\\n' {url}; echo done"],
                       user=user, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if first.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert first.exists(), proc.communicate(timeout=30)
        ours = [p for p in _descendants(proc.pid)
                if open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[0] == b"wireguard-go"]
        assert len(ours) == 1, ours
        os.kill(ours[0], 9)        # vpnw's own wireguard-go, started by this run
        second.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out, err)
    assert out.splitlines() == ["hello from the office", "502", "done"], (out, err)
    runs = proc.state_home / "vpnw" / "runs"
    files = sorted(runs.glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns)[-1:]
    events = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    fails = [e["fields"] for e in events if e["type"] == "conn.fail"]
    assert [(f["stage"], f["error"]) for f in fails] == [("path", "path-down")], fails
    assert len([e for e in events if e["type"] == "conn.open"]) == 1


def test_an_internal_name_is_resolved_by_the_office_dns_through_the_tunnel(world, office, user):
    mark = world.dns_mark()
    r = world.vpnw(["run", "--config", str(office.config), "--via", "office-dns", "--", "sh", "-c",
                    f"curl -sS --max-time 20 http://{INTERNAL}:{WEB_PORT}/hello.txt; "
                    f"curl -sS --max-time 20 --socks5-hostname 127.0.0.1:1080 --noproxy '' "
                    f"http://{INTERNAL}:{WEB_PORT}/hello.txt"], user=user, timeout=120)
    assert r.returncode == 0, describe(r)
    assert r.stdout.splitlines() == ["hello from the office"] * 2, describe(r)
    events = run_events(r)
    assert check_run(events) == [], check_run(events)
    lookups = [e["fields"] for e in events if e["type"] == "dns.resolve"]
    assert lookups and all(f["server"] == PEER_TUNNEL and f["addresses"] == [PEER_TUNNEL]
                           for f in lookups), lookups
    assert f"query[A] {INTERNAL} from {OUR_TUNNEL}" in office.dns_log()
    # The world's DNS server never heard the name.
    assert not [q for q in world.dns_queries(mark) if INTERNAL in q]


def test_deny_private_sees_the_tunnel_dns_answer(world, office, user):
    policy = world.file("wg-private.toml", 'version = 1\nname = "agent"\n\n[policy]\n'
                        'default = "deny"\ndeny_private = true\nallow = ["*.corp.example"]\n')
    r = world.vpnw(["guard", "--config", str(office.config), "--via", "office-dns", "--policy",
                    str(policy), "--", "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                    f"http://{CORP}:{WEB_PORT}/hello.txt"], user=user, timeout=120)
    assert r.returncode == 120 and r.stdout == "403", describe(r)
    events = run_events(r)
    denied = [e["fields"] for e in events if e["type"] == "policy.deny"]
    assert len(denied) == 1 and "private" in denied[0]["reason"], denied
    assert [e["fields"]["server"] for e in events if e["type"] == "dns.resolve"] == [PEER_TUNNEL]


def test_doctor_reports_what_wireguard_needs_and_checks_the_handshake(world, office, user):
    r = world.vpnw(["doctor", "--json", "--config", str(office.config)], user=user,
                   env={"VPNW_WG_HANDSHAKE_TIMEOUT": "3"}, timeout=120)
    checks = {c["name"]: c for c in map(json.loads, r.stdout.splitlines())}
    assert checks["wireguard-go"]["status"] == "ok", checks
    assert checks["tun"]["status"] == "ok" and "usable by this user" in checks["tun"]["detail"]
    assert checks["path office"]["status"] == "ok", checks["path office"]
    assert checks["path wrong"]["status"] == "warn" and "no handshake" in checks["path wrong"]["detail"]
    assert_no_key(office, r.stdout, r.stderr)


@pytest.mark.timeout(600)   # the transfers are allowed 300 s
def test_transfers_through_the_tunnel_are_byte_exact(world, office, user):
    sizes = [0, 1, 1399, 65537, 1048579, 64 << 20]
    www = office.dir / "www"
    for size in sizes:
        target = www / f"exact-{size}.bin"
        if not target.exists():
            with open(target, "wb") as f:
                f.write(os.urandom(size))
    url = f"http://{PEER_TUNNEL}:{WEB_PORT}"
    script = "; ".join(f"curl -sS --max-time 120 {url}/exact-{size}.bin | sha256sum" for size in sizes)
    r = world.vpnw(["run", "--config", str(office.config), "--via", "office", "--", "sh", "-c", script],
                   user=user, timeout=300)
    assert r.returncode == 0, describe(r)
    import hashlib
    expected = [hashlib.sha256((www / f"exact-{size}.bin").read_bytes()).hexdigest() for size in sizes]
    assert [line.split()[0] for line in r.stdout.splitlines()] == expected, describe(r)


def test_https_pip_and_git_through_the_tunnel(world, office, user):
    work = world.workdir(user)
    for left in ("wg-site", "wg-repo"):
        subprocess.run(["rm", "-rf", str(work / left)], check=True)
    script = (f"curl -sS --max-time 30 --cacert {world.ca_pem} https://{WEB}/whoami; echo; "
              f"{world.python} -m pip install -q --no-cache-dir --index-url http://{WEB}/simple "
              f"--trusted-host {WEB} --target {work / 'wg-site'} {DEMO_PACKAGE}; "
              f"git clone -q http://{WEB}/repo.git {work / 'wg-repo'}")
    r = world.vpnw(["run", "--config", str(office.config), "--via", "office-dns", "--", "sh", "-c", script],
                   user=user, timeout=180,
                   env={"PIP_CONFIG_FILE": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert r.returncode == 0, describe(r)
    assert r.stdout.startswith("{"), describe(r)
    whoami = json.loads(r.stdout.splitlines()[0])
    assert whoami["peer"] == OUR_TUNNEL and whoami["tls"], whoami
    assert DEMO_VALUE in (work / "wg-site" / DEMO_PACKAGE.replace("-", "_") / "__init__.py").read_text()
    assert (work / "wg-repo" / "README").read_text() == GIT_README
    events = run_events(r)
    opens = [e["fields"] for e in events if e["type"] == "conn.open"]
    assert opens and all(f["via"] == "office-dns" and f["address"] == PEER_TUNNEL for f in opens), opens
    assert_every_connection_accounted(events)


def test_a_public_host_through_the_tunnel_sees_the_tunnel_address(world, office, user):
    before = len(world.web_log())
    r = world.vpnw(["run", "--config", str(office.config), "--via", "office-all", "--", "sh", "-c",
                    f"curl -sS --max-time 20 http://{GITHUB}/whoami; echo; "
                    f"curl -sS --max-time 20 --noproxy '' --socks5-hostname 127.0.0.1:1080 http://{GITHUB}/whoami"],
                   user=user, timeout=120)
    assert r.returncode == 0, describe(r)
    seen = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [s["peer"] for s in seen] == [OUR_TUNNEL, OUR_TUNNEL], describe(r)
    # The world's web server saw both requests from the tunnel address, none from the world.
    log = world.web_log()[before:]
    assert len([line for line in log if "/whoami" in line]) == 2, log
    assert not [line for line in log if line.startswith(WORLD_V4)], log
    assert_no_key(office, r.stdout, r.stderr)


def _cmdline(pid: int) -> bytes | None:
    """A process's argv as the kernel has it; None once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None

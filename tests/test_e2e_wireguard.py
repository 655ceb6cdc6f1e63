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
import shutil
import subprocess
import time

import pytest

from e2e_support import assert_every_connection_accounted, describe, run_events

pytestmark = pytest.mark.world

SITE = "10.7.0.1"
PEER_TUNNEL = "10.66.0.1"
OUR_TUNNEL = "10.66.0.2"
WEB_PORT = 8471
INTERNAL = "tracker.office.internal"     # known only to the office's DNS server
CORP = "intranet.corp.example"           # the same, under a name no policy refuses by name


def _wg(*args: str, input: str | None = None) -> str:
    return subprocess.run(["wg", *args], input=input, capture_output=True, text=True,
                          check=True).stdout.strip()


class Office:
    """The peer: wireguard-go and a web server in the office namespace."""

    def __init__(self, world):
        self.world = world
        self.pid = world.exit_site(SITE)
        self.dir = world.tmp / "wg-office"
        self.dir.mkdir(exist_ok=True)
        (self.dir / "www").mkdir(exist_ok=True)
        (self.dir / "www" / "hello.txt").write_text("hello from the office\n")
        (self.dir / "www" / "blob.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 7))
        self.our_key = _wg("genkey")
        self.peer_key = _wg("genkey")
        self.wrong_key = _wg("genkey")
        peer_public = _wg("pubkey", input=self.peer_key)
        (self.dir / "peer.key").write_text(self.peer_key + "\n")
        self.log = self.dir / "web.log"
        script = f"""set -e
mount -t tmpfs tmpfs /run && mkdir /run/wireguard
WG_PROCESS_FOREGROUND=1 LOG_LEVEL=error setpriv --pdeathsig KILL -- wireguard-go wgo &
for i in $(seq 200); do [ -S /run/wireguard/wgo.sock ] && break; sleep 0.02; done
wg set wgo private-key {self.dir}/peer.key listen-port 51820 \\
    peer {_wg("pubkey", input=self.our_key)} allowed-ips {OUR_TUNNEL}/32
ip address add {PEER_TUNNEL}/24 dev wgo
ip link set wgo up
setpriv --pdeathsig KILL -- dnsmasq --keep-in-foreground --conf-file=/dev/null --pid-file \
    --user=root --group=root --listen-address={PEER_TUNNEL} --bind-interfaces --port=53 \
    --no-resolv --no-hosts --no-poll --address=/{INTERNAL}/{PEER_TUNNEL} \
    --address=/{CORP}/{PEER_TUNNEL} --local=/#/ \
    --log-queries --log-facility={self.dir}/dns.log &
setpriv --pdeathsig KILL -- python3 -m http.server --bind {PEER_TUNNEL} --directory {self.dir}/www {WEB_PORT} 2>{self.log} &
wait
"""
        self.proc = subprocess.Popen(["nsenter", "-t", str(self.pid), "-n", "--", "unshare", "--mount",
                                      "--propagation", "private", "--", "sh", "-c", script],
                                     stdin=subprocess.DEVNULL)
        world._started.append(self.proc)
        self.conf = world.file("office.conf", self._conf(self.our_key, peer_public))
        self.wrong_conf = world.file("wrong.conf", self._conf(self.wrong_key, peer_public))
        self.dns_conf = world.file("office-dns.conf", self._conf(self.our_key, peer_public)
                                   .replace("[Peer]", f"DNS = {PEER_TUNNEL}\n\n[Peer]"))
        self.config = world.file("wg-paths.toml", 'version = 1\nname = "office"\n\n'
                                 '[paths.office]\ntype = "wireguard"\nconf = "office.conf"\n\n'
                                 '[paths.office-dns]\ntype = "wireguard"\nconf = "office-dns.conf"\n\n'
                                 '[paths.wrong]\ntype = "wireguard"\nconf = "wrong.conf"\n\n'
                                 '[paths.dead]\ntype = "wireguard"\nconf = "dead.conf"\n')
        world.file("dead.conf", self._conf(self.our_key, peer_public, port=51999))
        # Ready when the web server answers on the office side.
        for _ in range(300):
            done = subprocess.run(["nsenter", "-t", str(self.pid), "-n", "--", "curl", "-s",
                                   f"http://{PEER_TUNNEL}:{WEB_PORT}/hello.txt"],
                                  capture_output=True, text=True)
            if done.stdout == "hello from the office\n":
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("the office web server did not start")

    @staticmethod
    def _conf(key: str, peer_public: str, port: int = 51820) -> str:
        return (f"[Interface]\nPrivateKey = {key}\nAddress = {OUR_TUNNEL}/32\n\n"
                f"[Peer]\nPublicKey = {peer_public}\nEndpoint = {SITE}:{port}\n"
                f"AllowedIPs = 10.66.0.0/24\n")

    def dns_log(self) -> str:
        path = self.dir / "dns.log"
        return path.read_text() if path.exists() else ""

    def web_log(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture(scope="module")
def office(world):
    for tool in ("wireguard-go", "wg"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup installs wireguard-go wireguard-tools)")
    return Office(world)


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
    record = b"".join(f.read_bytes() for f in r.run_files()).decode()
    assert_no_key(office, r.stdout, r.stderr, record)


def test_nothing_is_left_behind(world, office, user):
    r = world.vpnw(["run", "--config", str(office.config), "--via", "office", "--", "true"],
                   user=user, timeout=120)
    assert r.returncode == 0, describe(r)
    links = world.run(["ip", "-o", "link"]).stdout
    assert "vpnw0" not in links
    left = subprocess.run(["pgrep", "-a", "-f", "stages.wgpath|wireguard-go vpnw0"],
                          capture_output=True, text=True).stdout
    assert left == "", left


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

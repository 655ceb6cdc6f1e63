"""The test world's WireGuard office (tests and scripts/bench_wireguard.py):
Debian's wireguard-go as the peer in an exit-site namespace (10.7.0.1),
behind it on the tunnel's far side (10.66.0.1) a web server and a DNS server
that exist only there."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

from ci_support import cannot
from progs_support import prog_text
from world import SERVERS

SITE = "10.7.0.1"
PEER_TUNNEL = "10.66.0.1"
OUR_TUNNEL = "10.66.0.2"
BENCH_TUNNEL = "10.66.0.3"
WEB_PORT = 8471
INTERNAL = "tracker.office.internal"     # known only to the office's DNS server
CORP = "intranet.corp.example"           # the same, under a name no policy refuses by name
# The world's web (HTTPS, PyPI index, git) served in the office, under a name
# the world's test certificate covers (*.github.com).
WEB = "office.github.com"


def _wg(*args: str, input: str | None = None) -> str:
    return subprocess.run(["wg", *args], input=input, capture_output=True, text=True,
                          check=True).stdout.strip()


def office_of(world) -> "Office":
    """The world's one office, made on first use. Its namespace, peer and the
    internet's route back exist once per world, so every test module that
    uses the office (a worker may run several against one world) shares it."""
    for tool in ("wireguard-go", "wg"):
        if shutil.which(tool) is None:
            cannot(f"{tool} is not installed (scripts/setup installs wireguard-go wireguard-tools)")
    office = getattr(world, "_office", None)
    if office is None:
        office = world._office = Office(world)
    return office


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
        self.bench_key = _wg("genkey")      # a second client: the benchmark's baseline
        peer_public = _wg("pubkey", input=self.peer_key)
        (self.dir / "peer.key").write_text(self.peer_key + "\n")
        self.log = self.dir / "web.log"
        self.peer_public = peer_public
        env = {"WG_DIR": str(self.dir), "WG_OUR_PUBLIC": _wg("pubkey", input=self.our_key),
               "WG_BENCH_PUBLIC": _wg("pubkey", input=self.bench_key), "WG_OUR_TUNNEL": OUR_TUNNEL,
               "WG_BENCH_TUNNEL": BENCH_TUNNEL, "WG_PEER_TUNNEL": PEER_TUNNEL, "WG_INTERNAL": INTERNAL,
               "WG_CORP": CORP, "WG_WEB": WEB, "WG_PYTHON": str(world.python), "WG_SERVERS": str(SERVERS),
               "WG_DOCROOT": str(world.docroot), "WG_CERT": str(world._server_cert),
               "WG_KEY": str(world._server_key), "WG_WEB_PORT": str(WEB_PORT), "WG_LOG": str(self.log)}
        self.proc = subprocess.Popen(["nsenter", "-t", str(self.pid), "-n", "--", "unshare", "--mount",
                                      "--propagation", "private", "--", "sh", "-c",
                                      prog_text("wireguard_office.sh")],
                                     stdin=subprocess.DEVNULL, env={**os.environ, **env})
        world._started.append(self.proc)
        self._route_public_through_office()
        self.conf = world.file("office.conf", self._conf(self.our_key, peer_public))
        world.file("office-all.conf", self._conf(self.our_key, peer_public)
                   .replace("AllowedIPs = 10.66.0.0/24", "AllowedIPs = 0.0.0.0/0"))
        self.wrong_conf = world.file("wrong.conf", self._conf(self.wrong_key, peer_public))
        self.dns_conf = world.file("office-dns.conf", self._conf(self.our_key, peer_public)
                                   .replace("[Peer]", f"DNS = {PEER_TUNNEL}\n\n[Peer]"))
        self.config = world.file("wg-paths.toml", 'version = 1\nname = "office"\n\n'
                                 '[paths.office]\ntype = "wireguard"\nconf = "office.conf"\n\n'
                                 '[paths.office-dns]\ntype = "wireguard"\nconf = "office-dns.conf"\n\n'
                                 '[paths.office-all]\ntype = "wireguard"\nconf = "office-all.conf"\n\n'
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

    def _route_public_through_office(self) -> None:
        """The office forwards the tunnel's traffic to the world's internet,
        and the internet routes replies for our tunnel address (only that
        one: 10.66.0.1 stays unreachable from the world) back via the office."""
        office = ["nsenter", "-t", str(self.pid), "-n", "--"]
        internet = ["nsenter", "-t", str(self.world.internet_pid), "-n", "--"]
        for argv in ([*office, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                     [*internet, "ip", "rule", "add", "pref", "100", "to", f"{OUR_TUNNEL}/32", "lookup", "main"],
                     [*internet, "ip", "route", "replace", f"{OUR_TUNNEL}/32", "via", SITE]):
            subprocess.run(argv, check=True)

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



"""vpnw's benchmarks, each side by side with its baseline in the same run.

    scripts/bench/run [--quick] [--json] [--only startup,bulk,httpget,conns,paced,lat,leak,capture,secrets]
                      [--against REV] [--without-notifier]

Needs root. The whole run happens in a private network + mount namespace made
for it (loopback only; /etc/hosts there names bench.test -> an address of its own lo, ORIGIN_ADDR), so no
byte leaves loopback. The vpnw figures run the client INSIDE the sandbox
(`vpnw run -- client ...`); the broker dials the server on this namespace's
loopback. Debian's proxies run on the same loopback as the baselines people
already use: tinyproxy and squid (HTTP), dante and microsocks (SOCKS5), each
with the bench's own configuration (see "the Debian proxies" below).

`startup`: `vpnw run -- true` against `true`, four ways: the record to a file
(signed) and to stdout (`--record -`), each without and with --capture; and
each way again with every start-up trick off (VPNW_STARTUP_TRICKS=off,
stages/startup/tricks.py), interleaved, in the "tricks off" column. This
tree's runs are traced (VPNW_STARTUP_TRACE, stages/startup/trace.py):
the median time each process reached each of its marks is the start-up
budget (docs/architecture.md, "Start-up budget").

`bulk`: one upload of the bulk file to netload's sink: direct, through each
door (a tunnel) and through dante and squid. Timed by the client from its
connect to the sink's count (the figure judged); beside it, the connect and
handshake alone (a vpnw run's first connection waits for the broker's loop if
the program knocks before it has loaded) and the transfer after it. Each way
again with curl downloading the bulk file from nginx through the tunnel
(CONNECT with -p, SOCKS5 with the name sent; "(curl)" rows, beside curl
direct): the client of issue 33's figures, whose rows are the ones judged
(x direct, the whole transfer from curl's start, its first connect
included). Its own 16 KiB reads set direct's pace too, so a relay can keep
up with it. netload's rows are shown, not judged: its upload direct is
faster than any relay on two cores (the C relay's "x direct" is that
client's bound; docs/architecture.md, "Tunnel throughput: the bound").
Beside them the bound, "splice relay (C)": scripts/bench/splice_relay.c,
built here with gcc, a plain relay in front of the sink and of nginx (a
thread per direction, blocking splice through a 1 MiB pipe: the fastest
relay Linux allows without privileges; Debian's haproxy in TCP mode with
splice-auto measured slower here). "x relay" is each row over it, measured
by the same client: how much of the attainable vpnw's tunnels reach.

`httpget`: a plain http:// GET of the bulk file from nginx (Debian's, sendfile
on): direct, through vpnw's HTTP door (the client in the sandbox, the door as
its proxy: the forwarder, not a tunnel), squid and tinyproxy. Two clients:
netload's (recv_into one 4 MiB buffer: the client never caps the figure) and
curl (16 KiB reads: what a person's download sees). Timed by the client from
its request on, so vpnw's start-up is not in the figure. And the other way, a
plain http:// POST of the bulk file (Content-Length, sent with sendfile) to
netload's sink, which answers only once it has the whole body: the request
body through the same forwarder.

`conns`: new connections/s with 50 clients at a time, each connection:
connect, one HTTP/1.0 GET of a 64-byte answer from nginx by the name
bench.test, read to end of stream, close. nginx closes after each answer, so
every proxy dials the server anew per client connection, as vpnw does. Direct,
through tinyproxy, squid, dante, microsocks and vpnw's two doors, vpnw with a
policy of 10 rules and one of 10,000 (the allowed names last). Two clients:
ab (C, so the client is not the limit; HTTP only, ms resolution) and netload
(selectors; speaks SOCKS5 too, us resolution). Each row is set beside direct
and the fastest Debian proxy of its door, measured by the same client. vpnw
records each of these runs to a real file, as a user does (in the bench's
tmp dir on tmpfs, where the proxies write their logs). At full speed a
connection's latency is mostly its wait for a turn (50 / rate): shown, not judged.

`paced`: the added latency per connection: the same connections from 50
clients at 1,000 new connections a second in all, a load every way keeps up
with; each way's p50/p99 minus direct's.

`lat`: one connection at a time to netload's sink, by name, with the 10-rule
policy; vpnw's added p50/p99 (informational: the latency targets are judged
in `paced`).

`leak`: one `vpnw run` holds 1,000 tunnels open at once (SOCKS5 door), then
makes 10,000 forwarded GETs one after another (HTTP door). The open fds and
memory of vpnw's processes (and of the broker's: those that held the
tunnels) before, while the 1,000 are held, and after; ok when no fd is held
after that was not before and the record ends every connection the client
made (a conn.close or conn.fail for each, counted by type). "Before" comes
after a burst of 100 connections through each door, so what vpnw sets up
once when it first sees load (the broker's workers) is not taken for a leak.

`secrets`: a secret door (docs/secrets.md) against direct HTTPS to the same
stand-in model API (the test world's web server on this loopback, HTTPS,
requiring the real key): a small request's added time kept alive and on a
new connection, the added time to a streamed answer's first byte, and bulk
upload and download through the door (scripts/bench/secrets_bench.py).

Memory is vpnw's own processes (orchestrator, recorder, broker, helper, init:
every descendant of the vpnw process but the program). The target is judged
on their PSS: they are forked from one process, so their RSS summed counts
the pages they share once per process; the RSS sum is shown beside it.

`--against REV`: REV's vpnw, built from its own tree into a venv of its own
(against.py), runs beside this one in every section: each vpnw row gets a
twin "... @REV" in the same rounds, interleaved (`capture`: the capture and
SOCKS doors, the DNS door and --capture's start-up; a REV without capture is
left out of that section, said so; `leak`: one run of REV after this tree's),
and a last table sets each figure of this tree beside REV's (new / old; bulk
also the connect and the speed after it). The bench, its clients and its
servers are this tree's for both.

Figures are medians of --rounds runs (5; --quick: 3 rounds, 256 MiB, 1 s),
the variants interleaved round by round so machine noise hits all alike.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import glob
import json
import os
import pwd
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import exits  # noqa: E402  (tests/exits.py: wait_listening, Exit to stop a proxy, squid_conf)
import against  # noqa: E402  (scripts/bench/against.py: another revision's vpnw)
sys.path.insert(0, HERE)
import secrets_bench  # noqa: E402  (scripts/bench/secrets_bench.py: the secrets section)

VENV = os.environ.get("VPNW_VENV", "/opt/vpnw-venv")     # scripts/bench/run honours it too
PYTHON = f"{VENV}/bin/python"
VPNW = f"{VENV}/bin/vpnw"
NETLOAD = os.path.join(HERE, "netload.py")
NGINX = "/usr/sbin/nginx"
AB = "/usr/bin/ab"
SINK_PORT = 9000
RELAY_PORTS = (9200, 9201)     # the reference relay: in front of the sink, of nginx
REFERENCE = "splice relay (C)"
CAPTURE_ADDR = "10.77.0.1"     # not loopback, so a sandbox with --capture captures it
# Where vpnw's ways reach the servers: an address of this namespace's own lo,
# not 127.0.0.1, which vpnw never dials for a program (the machine step,
# docs/architecture.md "The machine itself"). It is the machine's own address
# too, so each vpnw way's policy names it by an address rule, as a user would.
ORIGIN_ADDR = "10.78.0.1"
NGINX_PORT = 9081
SMALL_PATH = "/small"
SMALL_BODY = "a small answer: one GET per connection, then nginx closes. 64 B\n"
VPNW_DOORS = {"http": 3128, "socks": 1080}                # inside the sandbox
DOOR_NAMES = {"http": "http", "socks": "socks5"}
POLICY_SIZES = (10, 10_000)
CLIENTS = 50
PACED_RATE = 1000     # new connections a second in the `paced` figure, from up to CLIENTS at a time
LEAK_WARM, LEAK_HELD, LEAK_SEQUENTIAL = 100, 1_000, 10_000
CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_REC, MS_PRIVATE, MS_BIND = 0x4000, 1 << 18, 4096


# ------------------------------------------------------------------ the place

def enter_private_namespace(tmp: str) -> None:
    """Net + mount namespace of our own, loopback up, bench.test in /etc/hosts."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
        raise SystemExit(f"unshare: {os.strerror(ctypes.get_errno())} (the benchmarks need root)")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise SystemExit(f"mount --make-rprivate /: {os.strerror(ctypes.get_errno())}")
    hosts = os.path.join(tmp, "hosts")
    with open(hosts, "w") as f:
        f.write(f"127.0.0.1 localhost\n{ORIGIN_ADDR} bench.test\n::1 localhost\n")
    if libc.mount(hosts.encode(), b"/etc/hosts", None, MS_BIND, None) != 0:
        raise SystemExit(f"bind /etc/hosts: {os.strerror(ctypes.get_errno())}")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # The capture section's "outside" address: on this namespace's own lo.
    subprocess.run(["ip", "addr", "add", f"{CAPTURE_ADDR}/32", "dev", "lo"], check=True)
    subprocess.run(["ip", "addr", "add", f"{ORIGIN_ADDR}/32", "dev", "lo"], check=True)


def raise_fd_limit() -> None:
    """Soft fd limit up to the hard one, for every process the bench starts
    alike: a shell's usual 1,024 would cap the 1,000 held connections (the
    client, the broker and nginx each hold one or two fds per connection)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def policy_text(rules: int, allowed: list[str]) -> str:
    """A deny-by-default policy of `rules` allow rules: filler that never
    matches (names with a port, some wildcards, some CIDR blocks, as a large
    generated policy holds), then the rules the bench needs, last, so a policy
    that scanned its rules would pay for every other one first."""
    filler = []
    for i in range(rules - len(allowed)):
        if i % 10 == 1:
            filler.append(f"*.svc{i}.example")
        elif i % 10 == 2:
            filler.append(f"10.{i >> 8 & 255}.{i & 255}.0/24")
        else:
            filler.append(f"host{i}.example:443")
    items = ",\n".join(f'  "{rule}"' for rule in filler + allowed)
    return f'version = 1\nname = "bench-{rules}"\n[policy]\ndefault = "deny"\nallow = [\n{items},\n]\n'


class Place:
    def __init__(self, quick: bool):
        # tmpfs: the proxies' logs and vpnw's records (see "the Debian proxies").
        self.tmp = tempfile.mkdtemp(prefix="vpnw-bench-", dir="/dev/shm")
        os.chmod(self.tmp, 0o755)
        self.size = (256 if quick else 1024) << 20
        self.payload = f"/dev/shm/vpnw-bench-{os.getpid()}"
        self.procs: list[subprocess.Popen] = []
        self.exits: list[exits.Exit] = []
        self.nginx: subprocess.Popen | None = None
        self.relay_ports: tuple[int, int] | None = None   # the reference relay's, once started
        self.policies = {}
        for rules in POLICY_SIZES:
            self.policies[rules] = os.path.join(self.tmp, f"policy-{rules}.toml")
            with open(self.policies[rules], "w") as f:
                f.write(policy_text(rules, [f"bench.test:{SINK_PORT}", f"bench.test:{NGINX_PORT}",
                                            ORIGIN_ADDR]))
        # The ways without a policy of N rules: only the origin's address rule.
        self.origin_policy = os.path.join(self.tmp, "policy-origin.toml")
        with open(self.origin_policy, "w") as f:
            f.write(f'version = 1\n[policy]\nallow = ["{ORIGIN_ADDR}"]\n')

    def start(self) -> "Place":
        enter_private_namespace(self.tmp)
        # vpnw's state (runs, the signing key, the ledger) in the bench's own
        # place: the runs it times never land in the user's ledger.
        os.environ["XDG_STATE_HOME"] = os.path.join(self.tmp, "state")
        raise_fd_limit()
        with open(self.payload, "wb") as f:
            chunk = b"\0" * (1 << 20)
            for _ in range(self.size >> 20):
                f.write(chunk)
        os.chmod(self.payload, 0o644)
        for host in ("127.0.0.1", ORIGIN_ADDR):
            sink = subprocess.Popen([PYTHON, NETLOAD, "serve", str(SINK_PORT), host], stdout=subprocess.PIPE)
            self.procs.append(sink)
            if sink.stdout.readline().strip() != b"ready":
                raise SystemExit(f"the sink did not start on {host}")
        return self

    def start_nginx(self) -> None:
        """nginx serving the bulk file as /payload (httpget) and a 64-byte
        answer as /small (conns, leak), closing after each: the conns figure
        is new connections at both ends."""
        if not os.path.exists(NGINX):
            raise SystemExit(f"httpget, conns and leak need {NGINX} (nginx-light; scripts/setup installs it)")
        www = os.path.join(self.tmp, "www")
        os.mkdir(www)
        os.chmod(www, 0o755)
        os.symlink(self.payload, os.path.join(www, "payload"))
        conf = os.path.join(self.tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""daemon off;
worker_processes 1;
pid {self.tmp}/nginx.pid;
error_log {self.tmp}/nginx-error.log;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    client_body_temp_path {self.tmp}/nginx-body;
    proxy_temp_path {self.tmp}/nginx-proxy;
    server {{
        listen 127.0.0.1:{NGINX_PORT} backlog=4096;
        listen {CAPTURE_ADDR}:{NGINX_PORT} backlog=4096;
        listen {ORIGIN_ADDR}:{NGINX_PORT} backlog=4096;
        root {www};
        location = {SMALL_PATH} {{ keepalive_timeout 0; return 200 "{SMALL_BODY.rstrip()}\\n"; }}
    }}
}}
""")
        self.nginx = subprocess.Popen([NGINX, "-e", f"{self.tmp}/nginx-error.log", "-c", conf],
                                      stdin=subprocess.DEVNULL)
        if not exits.wait_listening(NGINX_PORT, self.nginx):
            raise SystemExit(f"nginx did not start: see {self.tmp}/nginx-error.log")

    def start_reference_relay(self) -> None:
        """bulk's bound: splice_relay.c built into tmp and started in front of
        the sink and of nginx. Without gcc the row is left out, said so."""
        relay = os.path.join(self.tmp, "splice_relay")
        built = shutil.which("gcc") and subprocess.run(
            ["gcc", "-O2", "-pthread", "-o", relay, os.path.join(HERE, "splice_relay.c")]).returncode == 0
        if not built:
            print(f"bench: no {REFERENCE} row (it needs gcc; scripts/setup installs it)", file=sys.stderr)
            return
        for port, target in zip(RELAY_PORTS, (SINK_PORT, NGINX_PORT)):
            process = subprocess.Popen([relay, str(port), str(target)], stdout=subprocess.PIPE)
            self.procs.append(process)
            if process.stdout.readline().strip() != b"ready":
                raise SystemExit(f"{REFERENCE} did not start on port {port}")
        self.relay_ports = RELAY_PORTS

    def start_proxies(self) -> dict[str, tuple[str, int]]:
        """The Debian proxies installed here: kind -> (door, port)."""
        found = {}
        for kind, (door, port) in DEBIAN_PROXIES.items():
            if exits.missing(kind):
                continue
            self.exits.append(start_debian_proxy(kind, port, self.tmp))
            found[kind] = (door, port)
        return found

    def stop(self) -> None:
        if self.nginx is not None:
            # SIGTERM to the master: it stops its worker (SIGKILL would orphan it).
            self.nginx.terminate()
            self.nginx.wait()
        for e in self.exits:
            stop_debian_proxy(e)
        for p in self.procs:
            p.kill()
            p.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.payload)
        shutil.rmtree(self.tmp, ignore_errors=True)


# ------------------------------------------------------------------ the Debian proxies
#
# Fair means: each as Debian configures it, with only its concurrency limits
# raised so that 50 clients (and the leak check's 1,000) are never what caps
# it, and its usual per-connection log written to a file in the bench's tmp
# dir (vpnw records every connection too). That dir is on tmpfs: tinyproxy
# fsyncs every log line, and on this machine's disk that alone holds it near
# 100 connections/s (a figure about the disk); on tmpfs fsync costs nothing
# and every log and record is written to the same kind of place.
#   tinyproxy: Debian's settings (Timeout 600, LogLevel Info: some six lines
#     a connection), MaxClients 100 -> 2,048 (tests/exits.py's 64 is for tests).
#   squid: access_log as Debian's default (daemon:, squid format, a line per
#     request); max_filedescriptors set to 16,384 so no shell limit caps it;
#     `cache deny all` so it relays like the others and never answers from
#     its own store. One process, as Debian runs it (no SMP workers).
#   dante: a connect and a disconnect line per session (`log: connect
#     disconnect error`; Debian's sample logs errors only, which would make it
#     the one proxy that logs less than vpnw). It forks children as load
#     needs: no limit to raise.
#   microsocks: a thread per client, no limit; a line per connection to
#     stderr, kept in a file.
DEBIAN_PROXIES = {"tinyproxy": ("http", 9188), "squid": ("http", 9128),
                  "danted": ("socks", 9180), "microsocks": ("socks", 9181)}
PROXY_NAMES = {"tinyproxy": "tinyproxy", "squid": "squid", "danted": "dante", "microsocks": "microsocks"}
# squid names its shared memory in /dev/shm after its service name: one of
# the bench's own, so it never meets another squid's (a test's), and it is
# removed again when squid stops.
SQUID_SERVICE = f"vpnwbench{os.getpid()}"


def proxy_config(kind: str, port: int, workdir: str) -> tuple[dict[str, str], list[str]]:
    """(files to write in workdir, argv) for one Debian proxy on 127.0.0.1:port."""
    if kind == "tinyproxy":
        return {"tinyproxy.conf": f"""\
Port {port}
Listen 127.0.0.1
Timeout 600
MaxClients 2048
LogLevel Info
LogFile "{workdir}/tinyproxy.log"
PidFile "{workdir}/tinyproxy.pid"
ViaProxyName "tinyproxy"
"""}, ["/usr/bin/tinyproxy", "-d", "-c", f"{workdir}/tinyproxy.conf"]
    if kind == "squid":
        conf = exits.squid_conf(workdir, "127.0.0.1", port, "http_access allow all\n",
                                access_log=f"daemon:{workdir}/access.log squid",
                                extra="max_filedescriptors 16384\n")
        return {"squid.conf": conf}, ["/usr/sbin/squid", "-N", "-n", SQUID_SERVICE, "-f", f"{workdir}/squid.conf"]
    if kind == "danted":
        return {"danted.conf": f"""\
logoutput: {workdir}/danted.log
internal: 127.0.0.1 port = {port}
external: lo
clientmethod: none
socksmethod: none
user.privileged: root
user.unprivileged: nobody
client pass {{ from: 0/0 to: 0/0 log: error }}
socks pass {{ from: 0/0 to: 0/0 log: connect disconnect error }}
"""}, ["/usr/sbin/danted", "-f", f"{workdir}/danted.conf", "-p", f"{workdir}/danted.pid", "-N", "1"]
    if kind == "microsocks":
        return {}, ["/usr/bin/microsocks", "-i", "127.0.0.1", "-p", str(port)]
    raise ValueError(kind)


def start_debian_proxy(kind: str, port: int, tmp: str) -> exits.Exit:
    workdir = os.path.join(tmp, kind)
    os.mkdir(workdir)
    os.chmod(workdir, 0o755)
    if kind == "squid":
        # squid writes its logs after dropping to the proxy user.
        proxy = pwd.getpwnam("proxy")
        os.chown(workdir, proxy.pw_uid, proxy.pw_gid)
    files, argv = proxy_config(kind, port, workdir)
    for name, text in files.items():
        with open(os.path.join(workdir, name), "w") as f:
            f.write(text)
    with open(os.path.join(workdir, "stdio.out"), "wb") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                   start_new_session=True)
    proxy = exits.Exit(kind, port, process, workdir)
    if not exits.wait_listening(port, process):
        log = proxy.log()
        proxy.stop()
        raise SystemExit(f"{kind} did not start listening on 127.0.0.1:{port}\n{log}")
    return proxy


def stop_debian_proxy(proxy: exits.Exit) -> None:
    """squid is asked to stop (SIGTERM: it removes its shared memory, and
    shutdown_lifetime 0 makes that quick); then the process group goes."""
    if proxy.kind == "squid" and proxy.process.poll() is None:
        proxy.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proxy.process.wait(timeout=15)
    proxy.stop()
    if proxy.kind == "squid":
        for name in glob.glob(f"/dev/shm/{SQUID_SERVICE}-*"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)


# ------------------------------------------------------------------ ways to the server

@dataclass(frozen=True)
class Way:
    """How a client reaches the server: straight, through a Debian proxy, or
    through one of vpnw's doors (the client then runs inside `vpnw run`)."""
    label: str
    door: str | None = None               # "http" | "socks"; None: straight to the server
    port: int | None = None               # the proxy's port as the client sees it
    vpnw: tuple[str, ...] | None = None   # `vpnw run` arguments; None: the client runs plainly
    rules: int | None = None              # the size of vpnw's policy, if it has one
    rev: str | None = None                # --against's revision; None: this tree's vpnw
    via: tuple[int, int] | None = None    # a plain relay's ports (the sink's, nginx's): connect there

    @property
    def server_host(self) -> str:
        """The servers' address as this way's client dials it (ORIGIN_ADDR)."""
        return "127.0.0.1" if self.vpnw is None else ORIGIN_ADDR

    def server_port(self, port: int) -> int:
        """The port the client connects to for the server on `port`."""
        return port if self.via is None else self.via[(SINK_PORT, NGINX_PORT).index(port)]

    @property
    def kind(self) -> str:
        if self.vpnw is None:
            return "direct" if self.door is None else "debian"
        return "vpnw" if self.rev is None else "against"

    @property
    def executable(self) -> str:
        return VPNW if self.rev is None else AGAINST[self.rev]

    def door_args(self) -> list[str]:
        """netload's way of naming the proxy."""
        return [f"--{self.door}", str(self.port)] if self.door else []


DIRECT = Way("direct")


def vpnw_way(door: str, rules: int | None = None, rev: str | None = None) -> Way:
    label = f"vpnw {DOOR_NAMES[door]}" + (f", {rules:,} rules" if rules else "") + (f" @{rev}" if rev else "")
    policy = ("--policy", PLACE.policies[rules] if rules else PLACE.origin_policy)
    return Way(label, door, VPNW_DOORS[door], policy, rules, rev)


def vpnw_ways(door: str, rules: int | None = None) -> list[Way]:
    """This tree's vpnw way and, with --against, REV's twin right after it;
    with --without-notifier, this tree's again with --allow-unix-sockets."""
    ways = [vpnw_way(door, rules), *(vpnw_way(door, rules, rev) for rev in AGAINST)]
    if WITHOUT_NOTIFIER:
        way = vpnw_way(door, rules)
        ways.append(Way(way.label + ", no notifier", way.door, way.port,
                        (*way.vpnw, "--allow-unix-sockets"), way.rules))
    return ways


def debian_way(kind: str, proxies: dict) -> Way:
    door, port = proxies[kind]
    return Way(f"{PROXY_NAMES[kind]} {DOOR_NAMES[door]}", door, port)


def variants(proxies: dict, with_policy: bool = False) -> list[Way]:
    """bulk's and lat's ways: direct, both doors, dante and squid; bulk's
    also the reference relay, when it runs."""
    rules = POLICY_SIZES[0] if with_policy else None
    reference = [Way(REFERENCE, via=PLACE.relay_ports)] if PLACE.relay_ports and not with_policy else []
    return ([DIRECT, *reference, *vpnw_ways("http", rules), *vpnw_ways("socks", rules)]
            + [debian_way(kind, proxies) for kind in ("danted", "squid") if kind in proxies])


def conns_ways(proxies: dict) -> list[Way]:
    """Direct, then per door its Debian proxies and vpnw with each policy."""
    ways = [DIRECT]
    for door in ("http", "socks"):
        ways += [debian_way(kind, proxies) for kind in DEBIAN_PROXIES
                 if kind in proxies and proxies[kind][0] == door]
        ways += [way for rules in POLICY_SIZES for way in vpnw_ways(door, rules)]
    return ways


# ------------------------------------------------------------------ vpnw's own processes

def descendants(root: int) -> list[int]:
    """root and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def _cmdline(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def vpnw_processes(root: int) -> list[int]:
    """vpnw's own processes under the vpnw process `root`. The stages are
    forked from it and never exec, so they share its argv; the program (and
    whatever it starts) was exec'd and does not."""
    argv = _cmdline(root)
    return [pid for pid in descendants(root) if argv is not None and _cmdline(pid) == argv]


def memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in KiB; (0, 0) once it is gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def fd_kinds(pid: int) -> dict[str, int]:
    """What a process holds open, by kind ("socket", "pipe", "anon_inode:[eventpoll]", a path)."""
    kinds: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                kind = target.split(":[")[0] if target.startswith(("socket:", "pipe:")) else target
                kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


class MemorySampler:
    """Peak RSS and PSS of vpnw's own processes, summed, while a run lasts.
    Sampled every 0.1 s, the process list looked for again every 0.5 s:
    walking /proc takes CPU from the run under measurement (a 1 s conns run
    measured ~2% slower when sampled every 0.05 s)."""

    def __init__(self, root_pid: int):
        self.root = root_pid
        self.peak_rss = self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        pids, found_at = [], 0.0
        while not self._stop.wait(0.1):
            if time.monotonic() - found_at > 0.5:
                pids, found_at = vpnw_processes(self.root), time.monotonic()
            sizes = [memory_kb(pid) for pid in pids]
            self.peak_rss = max(self.peak_rss, sum(r for r, _ in sizes))
            self.peak_pss = max(self.peak_pss, sum(p for _, p in sizes))


# ------------------------------------------------------------------ running a client

@contextlib.contextmanager
def record_file(name: str):
    """A record path in the bench's tmp dir, gone again afterwards (a conns
    run records some 10^4 connections)."""
    path = os.path.join(PLACE.tmp, f"{name}.jsonl")
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def in_way(argv: list[str], way: Way, record: str = os.devnull) -> list[str]:
    """argv as it runs for this way: inside `vpnw run` for vpnw's doors."""
    if way.vpnw is None:
        return argv
    return [way.executable, "run", "--record", record, *way.vpnw, "--", *argv]


def run_program(argv: list[str], way: Way, *, record: str = os.devnull,
                sampler: bool = False) -> tuple[str, dict]:
    """Run argv for this way; its stdout and, when sampled, vpnw's peak memory."""
    cmd = in_way(argv, way, record)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    memory = {}
    if sampler and way.vpnw is not None:
        with MemorySampler(proc.pid) as s:
            out, err = proc.communicate(timeout=600)
        memory = {"rss_kb": s.peak_rss, "pss_kb": s.peak_pss}
    else:
        out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{way.label}: {' '.join(cmd[:10])}... exited {proc.returncode}: {err[-800:]}")
    return out, memory


def run_netload(args: list[str], way: Way, **kw) -> dict:
    out, memory = run_program([PYTHON, NETLOAD, *args, *way.door_args()], way, **kw)
    return {**json.loads(out.strip().splitlines()[-1]), **memory}


def parse_ab(text: str) -> dict:
    """ab's report -> rate (good answers a second), p50/p99 (whole ms), errors."""
    def number(label: str, default=None):
        m = re.search(rf"^{label}:\s+([\d.]+)", text, re.M)
        if m is None and default is None:
            raise RuntimeError(f"ab said no {label!r}:\n{text[-800:]}")
        return float(m.group(1)) if m else default
    complete = number("Complete requests")
    errors = number("Failed requests") + number("Non-2xx responses", 0)
    seconds = number("Time taken for tests")
    percent = {int(p): float(ms) for p, ms in re.findall(r"^\s+(\d+)%\s+(\d+)", text, re.M)}
    return {"connections": int(complete - errors), "errors": int(errors), "seconds": seconds,
            "rate": (complete - errors) / seconds, "p50_ms": percent.get(50), "p99_ms": percent.get(99)}


def run_ab(way: Way, seconds: int, **kw) -> dict:
    """ab, CLIENTS at a time for `seconds`, GET /small by name (through the
    HTTP proxy with -X: absolute-form, forwarded). -r: a failed receive is
    counted, not the end of the run."""
    argv = [AB, "-q", "-r", "-c", str(CLIENTS), "-t", str(seconds), "-n", str(seconds * 200_000)]
    if way.door:
        argv += ["-X", f"127.0.0.1:{way.port}"]
    argv.append(f"http://bench.test:{NGINX_PORT}{SMALL_PATH}")
    out, memory = run_program(argv, way, **kw)
    return {**parse_ab(out), **memory}


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def peak_mib(results: list[dict], key: str) -> float | None:
    return max((r.get(key, 0) for r in results), default=0) / 1024 or None


# ------------------------------------------------------------------ the figures

# bulk's second client: curl downloading the bulk file from nginx through the
# same way (16 KiB reads: a person's download), the client issue 33 measured
# its tunnel line with, so its rows are the ones judged. netload's upload
# (sendfile in, recv_into 4 MiB out) is shown beside them, not judged: direct,
# it is faster than any relay reaches on two cores (the C relay's row).
CURL = " (curl)"


def bench_bulk(rounds: int, proxies: dict) -> dict:
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for way in variants(proxies):
            url = f"http://{way.server_host}:{way.server_port(NGINX_PORT)}/payload"
            r = run_netload(["bulk", "--to", f"{way.server_host}:{way.server_port(SINK_PORT)}", "--file", PLACE.payload],
                            way, sampler=True)
            if r["received"] != r["bytes"]:
                raise RuntimeError(f"{way.label}: sent {r['bytes']} but the sink counted {r['received']}")
            runs.setdefault(way.label, []).append(r)
            r = run_curl_get(url, way, tunnel=True)
            if r["status"] != 200 or r["bytes"] != PLACE.size:
                raise RuntimeError(f"{way.label} (curl): status {r['status']}, {r['bytes']} of {PLACE.size} bytes")
            runs.setdefault(way.label + CURL, []).append(r)
    return bulk_figures(runs)


def bulk_figures(runs: dict[str, list[dict]]) -> dict:
    """Each row's medians, and its ratios to direct measured by the same
    client (a "(curl)" row to "direct (curl)"), and to the reference relay's
    (x_reference, None without it). Pure: runs in, figures out."""
    out = {label: {"gbps": median([r["gbps"] for r in rs]),
                   "handshake_ms": median([r["handshake_s"] * 1e3 for r in rs]),
                   "tunnel_gbps": median([r["bytes"] / (r["seconds"] - r["handshake_s"]) / 1e9 for r in rs]),
                   "rss_mib": peak_mib(rs, "rss_kb"), "pss_mib": peak_mib(rs, "pss_kb")}
           for label, rs in runs.items()}
    for label, v in out.items():
        client = CURL if label.endswith(CURL) else ""
        direct, reference = out["direct" + client], out.get(REFERENCE + client)
        v["x_direct"] = v["gbps"] / direct["gbps"]
        v["x_reference"] = v["gbps"] / reference["gbps"] if reference else None
        v["tunnel_x_direct"] = v["tunnel_gbps"] / direct["tunnel_gbps"]
    return out


def bulk_note(bulk: dict) -> str:
    """What the bulk table judges, and netload's bound (the C relay's row)."""
    note = f"judged: the{CURL} rows, issue 33's line (whole transfer, first connect included)"
    reference = bulk.get(REFERENCE)
    if reference:
        note += (f"; netload's upload is faster direct than any relay here: {REFERENCE} "
                 f"{reference['x_direct']:.2f}x direct is its bound")
    return note


def run_curl_get(url: str, way: Way, tunnel: bool = False) -> dict:
    """curl GET url (through the HTTP proxy of the way, forwarded; with
    `tunnel`, through the way's door as a tunnel: CONNECT (-p) or SOCKS5 with
    the name sent); curl's own figures, its connect and handshake
    (pretransfer) among them."""
    argv = ["curl", "-sS", "--fail", "-o", "/dev/null", "--noproxy", "" if way.door else "*",
            "-w", "%{size_download} %{speed_download} %{http_code} %{time_pretransfer} %{time_total}"]
    if way.door == "socks" and tunnel:
        argv += ["--socks5-hostname", f"127.0.0.1:{way.port}"]
    elif way.door:
        argv += ["-p"] * tunnel + ["-x", f"http://127.0.0.1:{way.port}"]
    out, _ = run_program([*argv, url], way)
    size, speed, code, pretransfer, total = out.split()
    return {"bytes": int(size), "gbps": float(speed) / 1e9, "status": int(code),
            "seconds": float(total), "handshake_s": float(pretransfer)}


def bench_httpget(rounds: int, proxies: dict) -> dict:
    """A plain http:// GET of the bulk file from nginx: direct, vpnw's HTTP
    door, squid, tinyproxy; the rounds interleaved."""
    ways = [DIRECT, *vpnw_ways("http")]
    ways += [debian_way(kind, proxies) for kind in ("squid", "tinyproxy") if kind in proxies]
    runs: dict[str, list[float]] = {}
    for _ in range(rounds):
        for way in ways:
            url = f"http://{way.server_host}:{NGINX_PORT}/payload"
            r = run_netload(["get", "--to", f"{way.server_host}:{NGINX_PORT}", "--path", "/payload"], way)
            if r["bytes"] != PLACE.size:
                raise RuntimeError(f"{way.label}: {r['bytes']} of {PLACE.size} bytes")
            runs.setdefault(way.label, []).append(r["gbps"])
            r = run_curl_get(url, way)
            if r["status"] != 200 or r["bytes"] != PLACE.size:
                raise RuntimeError(f"{way.label} (curl): status {r['status']}, {r['bytes']} of {PLACE.size} bytes")
            runs.setdefault(way.label + " (curl)", []).append(r["gbps"])
            r = run_netload(["post", "--to", f"{way.server_host}:{SINK_PORT}", "--path", "/upload",
                             "--file", PLACE.payload], way)
            if r["bytes"] != PLACE.size:
                raise RuntimeError(f"{way.label} (POST): the sink got {r['bytes']} of {PLACE.size} bytes")
            runs.setdefault(way.label + " (POST)", []).append(r["gbps"])
    out = {label: {"gbps": median(v), "rounds": v} for label, v in runs.items()}
    for label, v in out.items():
        v["x_direct"] = v["gbps"] / out[_httpget_base(label)]["gbps"]
    return dict(sorted(out.items(), key=lambda kv: _httpget_base(kv[0])))


def _httpget_base(label: str) -> str:
    """The direct row a httpget row is compared with: same client, same way."""
    for client in (" (curl)", " (POST)"):
        if label.endswith(client):
            return "direct" + client
    return "direct"


def compare_conns(rows: list[dict]) -> list[dict]:
    """Each row beside direct and the fastest Debian proxy of its door, both
    measured by the same client; netload's rows get the latency they add to
    direct's. Pure: rows in, rows out."""
    direct = {r["client"]: r for r in rows if r["kind"] == "direct"}
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r["client"], r["door"])
        if r["kind"] == "debian" and (key not in best or r["rate"] > best[key]["rate"]):
            best[key] = r
    out = []
    for r in rows:
        r = dict(r)
        base = direct[r["client"]]
        r["x_direct"] = r["rate"] / base["rate"]
        fastest = best.get((r["client"], r["door"]))
        r["best_proxy"] = fastest["label"] if fastest else None
        r["x_best_proxy"] = r["rate"] / fastest["rate"] if fastest else None
        if r["client"] == "netload":
            r["added_p50_ms"] = r["p50_ms"] - base["p50_ms"]
            r["added_p99_ms"] = r["p99_ms"] - base["p99_ms"]
        out.append(r)
    return out


def bench_conns(rounds: int, proxies: dict, seconds: int) -> dict:
    """New connections/s, CLIENTS at a time, by ab (HTTP ways) and netload
    (every way), interleaved round by round."""
    runs: dict[tuple[str, Way], list[dict]] = {}
    target = ["--to", f"bench.test:{NGINX_PORT}", "--get", SMALL_PATH]
    netload_args = ["conns", *target, "--clients", str(CLIENTS), "--seconds", str(seconds)]
    for _ in range(rounds):
        for client in ("ab", "netload"):
            for way in conns_ways(proxies):
                if client == "ab" and way.door == "socks":
                    continue        # ab speaks no SOCKS5
                with record_file("conns") as record:
                    r = (run_ab(way, seconds, record=record, sampler=True) if client == "ab" else
                         run_netload(netload_args, way, record=record, sampler=True))
                runs.setdefault((client, way), []).append(r)
    rows = [{"client": client, "label": way.label, "door": way.door, "kind": way.kind, "rules": way.rules,
             "rate": median([r["rate"] for r in rs]),
             "p50_ms": median([r["p50_ms"] for r in rs]), "p99_ms": median([r["p99_ms"] for r in rs]),
             "errors": sum(r["errors"] for r in rs), "connections": sum(r["connections"] for r in rs),
             "rss_mib": peak_mib(rs, "rss_kb"), "pss_mib": peak_mib(rs, "pss_kb")}
            for (client, way), rs in runs.items()]
    return {"clients": CLIENTS, "seconds": seconds, "rows": compare_conns(rows)}


def bench_paced(rounds: int, proxies: dict, seconds: int) -> dict:
    """Added latency per connection under CLIENTS clients at a load every way
    keeps up with (PACED_RATE new connections a second in all): at full speed
    (`conns`) a connection mostly waits its turn, 50 / rate, and the figure
    says how fast a way is, not what it adds. netload's rounds, interleaved."""
    runs: dict[Way, list[dict]] = {}
    args = ["conns", "--to", f"bench.test:{NGINX_PORT}", "--get", SMALL_PATH, "--clients", str(CLIENTS),
            "--seconds", str(seconds), "--rate", str(PACED_RATE)]
    for _ in range(rounds):
        for way in conns_ways(proxies):
            with record_file("paced") as record:
                runs.setdefault(way, []).append(run_netload(args, way, record=record))
    rows = [{"label": way.label, "door": way.door, "kind": way.kind, "rules": way.rules,
             "rate": median([r["rate"] for r in rs]), "errors": sum(r["errors"] for r in rs),
             "p50_ms": median([r["p50_ms"] for r in rs]), "p99_ms": median([r["p99_ms"] for r in rs])}
            for way, rs in runs.items()]
    base = next(r for r in rows if r["kind"] == "direct")
    for r in rows:
        r["added_p50_ms"] = r["p50_ms"] - base["p50_ms"]
        r["added_p99_ms"] = r["p99_ms"] - base["p99_ms"]
    return {"clients": CLIENTS, "rate": PACED_RATE, "seconds": seconds, "rows": rows}


def bench_latency(rounds: int, proxies: dict, count: int) -> dict:
    """One connection at a time to bench.test (a name: vpnw resolves it and the
    policy allows it); added = p50 minus direct's p50."""
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for way in variants(proxies, with_policy=True):
            to = f"127.0.0.1:{SINK_PORT}" if way is DIRECT else f"bench.test:{SINK_PORT}"
            runs.setdefault(way.label, []).append(run_netload(["lat", "--to", to, "--count", str(count)], way))
    out = {label: {"p50_ms": median([r["p50_ms"] for r in rs]),
                   "p99_ms": median([r["p99_ms"] for r in rs])} for label, rs in runs.items()}
    base50, base99 = out["direct"]["p50_ms"], out["direct"]["p99_ms"]
    for v in out.values():
        v["added_p50_ms"] = v["p50_ms"] - base50
        v["added_p99_ms"] = v["p99_ms"] - base99
    return out


def count_types(record: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    with open(record) as f:
        for line in f:
            kind = json.loads(line)["type"]
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def record_ends(types: dict[str, int]) -> int:
    """Connections the record ended: each in exactly one of these (docs/record.md)."""
    return types.get("conn.close", 0) + types.get("conn.fail", 0) + types.get("policy.deny", 0)


def judge_leak(made: int, client_errors: int, types: dict[str, int],
               fd_kinds: dict[str, dict[str, int]]) -> list[str]:
    """What is wrong with a leak run, [] when nothing. Every connection the
    client made ends once in the record; every open is closed; vpnw's
    processes hold no fd after that they did not hold before. Pure."""
    ends = record_ends(types)
    wrong = []
    if client_errors:
        wrong.append(f"the client saw {client_errors} errors")
    if ends != made:
        wrong.append(f"the client made {made} connections, the record ends {ends}")
    if types.get("conn.open", 0) != types.get("conn.close", 0):
        wrong.append(f"{types.get('conn.open', 0)} conn.open but {types.get('conn.close', 0)} conn.close")
    before, after = fd_kinds["before"], fd_kinds["after"]
    more = {kind: n - before.get(kind, 0) for kind, n in after.items() if n > before.get(kind, 0)}
    if more:
        wrong.append("vpnw holds more fds after than before: "
                     + ", ".join(f"+{n} {kind}" for kind, n in sorted(more.items())))
    return wrong


def bench_leak(rev: str | None = None) -> dict:
    """One vpnw run (this tree's, or REV's): LEAK_HELD tunnels held at once,
    then LEAK_SEQUENTIAL GETs one by one; vpnw's processes' fds and memory at
    each of the client's checkpoints; the record counted by type."""
    argv = [PYTHON, NETLOAD, "hold", "--to", f"bench.test:{NGINX_PORT}", "--get", SMALL_PATH,
            "--socks", str(VPNW_DOORS["socks"]), "--http", str(VPNW_DOORS["http"]),
            "--warm", str(LEAK_WARM), "--held", str(LEAK_HELD), "--count", str(LEAK_SEQUENTIAL)]
    way = vpnw_way("http", POLICY_SIZES[0], rev)
    seen: dict[str, dict[int, dict]] = {}       # checkpoint -> pid -> fds, kinds, rss, pss
    with record_file("leak") as record, open(os.path.join(PLACE.tmp, "leak.err"), "w+") as err:
        proc = subprocess.Popen(in_way(argv, way, record), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True)
        try:
            for checkpoint in ("before", "held", "after"):
                if not proc.stdout.readline():
                    err.seek(0)
                    raise RuntimeError(f"leak: the client stopped before {checkpoint}: {err.read()[-800:]}")
                if checkpoint == "after":
                    settle(seen["before"])
                seen[checkpoint] = {pid: look_at(pid) for pid in vpnw_processes(proc.pid)}
                proc.stdin.write("\n")
                proc.stdin.flush()
            client = json.loads(proc.stdout.read().strip().splitlines()[-1])
            if proc.wait(timeout=60) != 0:
                err.seek(0)
                raise RuntimeError(f"leak: vpnw exited {proc.returncode}: {err.read()[-800:]}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        types = count_types(record)
    # The broker: whichever of vpnw's processes held the tunnels (one, or
    # several workers), seen by their fds rising while the tunnels were held.
    broker = [pid for pid, v in seen["held"].items()
              if v["fds"] > seen["before"].get(pid, {"fds": 0})["fds"] + 10]

    def total(key: str, pids=None) -> dict[str, float]:
        return {c: sum(v[key] for pid, v in seen[c].items() if pids is None or pid in pids) for c in seen}

    kinds = {c: add_counts(v["kinds"] for v in seen[c].values()) for c in seen}
    return {"made": client["made"], "warm": client["warm"], "held": client["held"],
            "sequential": client["sequential"],
            "client_errors": client["errors"], "record": types,
            "processes": {c: len(seen[c]) for c in seen}, "broker_processes": len(broker),
            "vpnw_fds": total("fds"), "broker_fds": total("fds", broker),
            "broker_fd_kinds_held": add_counts(seen["held"][pid]["kinds"] for pid in broker),
            "broker_rss_mib": {c: kb / 1024 for c, kb in total("rss_kb", broker).items()},
            "vpnw_rss_mib": {c: kb / 1024 for c, kb in total("rss_kb").items()},
            "vpnw_pss_mib": {c: kb / 1024 for c, kb in total("pss_kb").items()},
            "wrong": judge_leak(client["made"], client["errors"], types, kinds)}


def look_at(pid: int) -> dict:
    rss, pss = memory_kb(pid)
    return {"fds": fd_count(pid), "kinds": fd_kinds(pid), "rss_kb": rss, "pss_kb": pss}


def add_counts(counts) -> dict[str, int]:
    out: dict[str, int] = {}
    for one in counts:
        for key, n in one.items():
            out[key] = out.get(key, 0) + n
    return out


def settle(before: dict[int, dict], deadline_s: float = 2.0) -> None:
    """Give the broker a moment to close what the client just closed (it
    learns of each end a little after the client does): wait until no vpnw
    process holds more fds than before, or the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if all(fd_count(pid) <= v["fds"] for pid, v in before.items()):
            return
        time.sleep(0.05)


def _ts(record_ts: str) -> int:
    """The record's RFC 3339 nanosecond time -> ns since the epoch."""
    whole, frac = record_ts.rstrip("Z").split(".")
    secs = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return int(secs) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])


# `vpnw run -- true` four ways: the record to a file (signed) or to stdout
# (`--record -`, not signed), each without and with --capture.
STARTUP_WAYS = {"signed": ("--record", "{record}"), "--record -": ("--record", "-"),
                "signed --capture": ("--capture", "--record", "{record}"),
                "--record - --capture": ("--capture", "--record", "-")}
TRACE_VARIABLE = "VPNW_STARTUP_TRACE"     # stages/startup/trace.py
TRICKS_VARIABLE = "VPNW_STARTUP_TRICKS"   # stages/startup/__init__.py
# This tree's vpnw again with every start-up trick off, a build of its own
# in bench_startup's runs (the "tricks off" column).
TRICKS_OFF = "tricks off"


def startup_once(vpnw: str, args: tuple[str, ...], record: str, trace: str | None,
                 tricks_off: bool = False) -> tuple[float, dict]:
    """One `vpnw run ARGS -- true`: its wall time (ms) and, with `trace`
    (a file for stages/startup/trace.py), when each process reached
    each of its marks, in ms from the start (REV's vpnw may know none).
    `tricks_off`: with VPNW_STARTUP_TRICKS=off."""
    env = dict(os.environ)
    env.pop(TRACE_VARIABLE, None)
    env.pop(TRICKS_VARIABLE, None)
    if tricks_off:
        env[TRICKS_VARIABLE] = "off"
    if trace:
        env[TRACE_VARIABLE] = trace
        with contextlib.suppress(FileNotFoundError):
            os.unlink(trace)
    argv = [vpnw, "run", *(a.format(record=record) for a in args), "--", "true"]
    t0 = time.monotonic_ns()     # CLOCK_MONOTONIC, the trace's clock
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    t_end = time.monotonic_ns()
    # The .minisig too: each run's own, as in the state directory. One left
    # from the run before is replaced, and before 4a8053b it was truncated in
    # place (on ext4 a write-back when closed, 0.5-4 ms on the way out), a
    # cost that only runs reusing a --record name pay.
    for made in (record, record + ".minisig"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(made)
    return (t_end - t0) / 1e6, (read_trace(trace, t0) if trace else {})


def read_trace(path: str, t0: int) -> dict[str, float]:
    """"stage: what" -> ms from t0 (a mark seen twice keeps its first time),
    and "cpu: stage" -> the CPU ms each process of the stage had used at its
    last mark (summed over the stage's processes: init counts its own)."""
    marks, cpu = {}, {}
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        for line in sorted(f, key=lambda l: int(l.split(" ", 1)[0])):
            ns, pid, cpu_us, stage, what = line.rstrip("\n").split(" ", 4)
            if not cpu_us.isdigit():      # a REV whose marks carry no CPU time yet
                continue
            marks.setdefault(f"{stage}: {what}", (int(ns) - t0) / 1e6)
            cpu[(stage, pid)] = int(cpu_us) / 1e3
            if (stage, what) == ("vpnw", "helper forked"):    # vpnw alone, step 1 of the budget
                marks.setdefault("cpu: vpnw until the helper forked", int(cpu_us) / 1e3)
            if (stage, what) == ("vpnw", "recorder forked"):  # vpnw's part before the stages run
                marks.setdefault("cpu: vpnw until the recorder forked", int(cpu_us) / 1e3)
    for (stage, _pid), ms in cpu.items():
        marks[f"cpu: {stage}"] = marks.get(f"cpu: {stage}", 0.0) + ms
    return marks


def bench_startup(rounds: int) -> dict:
    """`vpnw run -- true` against `true` (and REV's vpnw, with --against),
    each of STARTUP_WAYS, the runs interleaved; every run traced (each
    process's marks: the start-up budget; a REV's too, for the CPU each of
    its stages used, when it has the trace). This tree's vpnw runs twice
    a round, the second time with the start-up tricks off (TRICKS_OFF)."""
    record = os.path.join(PLACE.tmp, "startup.jsonl")
    trace = os.path.join(PLACE.tmp, "startup.trace")
    builds = {None: VPNW, TRICKS_OFF: VPNW, **AGAINST}
    walls = {(rev, way): [] for rev in builds for way in STARTUP_WAYS}
    timelines = {(rev, way): [] for rev in builds for way in STARTUP_WAYS}
    plain = []
    unknown = set()      # (REV, way) whose options REV does not have (121): left out
    for i in range(rounds + 1):          # the first round only warms the page cache
        t0 = time.time_ns()
        subprocess.run(["true"], check=True)
        if i:
            plain.append((time.time_ns() - t0) / 1e6)
        for way, args in STARTUP_WAYS.items():
            for rev, vpnw in builds.items():
                if (rev, way) in unknown:
                    continue
                try:
                    wall, marks = startup_once(vpnw, args, record, trace, tricks_off=rev == TRICKS_OFF)
                except subprocess.CalledProcessError as exc:
                    if rev in (None, TRICKS_OFF) or exc.returncode != 121:
                        raise
                    unknown.add((rev, way))
                    continue
                if i:
                    walls[(rev, way)].append(wall)
                    timelines[(rev, way)].append(marks)
    true_ms = median(plain)

    def figures(rev) -> dict:
        return {way: median(walls[(rev, way)]) - true_ms if walls[(rev, way)] else None
                for way in STARTUP_WAYS}
    def cpu(rev) -> dict:
        """way -> stage -> median CPU ms (stages/startup/trace.py's CPU column)."""
        return {way: {k[5:]: v for k, v in _median_marks(timelines[(rev, way)]).items()
                      if k.startswith("cpu: ")} for way in STARTUP_WAYS}
    return {"true_ms": true_ms, "vpnw_ms": median(walls[(None, "signed")]), "over_ms": figures(None),
            "timeline_ms": {way: _median_marks(timelines[(None, way)]) for way in STARTUP_WAYS},
            "timeline_runs": {way: _runs_with(timelines[(None, way)]) for way in STARTUP_WAYS},
            "cpu_ms": cpu(None),
            "tricks_off": {"over_ms": figures(TRICKS_OFF), "cpu_ms": cpu(TRICKS_OFF)},
            "against": {rev: {"over_ms": figures(rev), "cpu_ms": cpu(rev)} for rev in AGAINST}}


def _median_marks(runs: list[dict]) -> dict[str, float]:
    """Each mark's median time, in the order the marks come."""
    keys = dict.fromkeys(k for run in runs for k in run)
    out = {k: median([run.get(k) for run in runs]) for k in keys}
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def _runs_with(runs: list[dict]) -> dict:
    """"of": how many runs; each mark seen in fewer of them -> in how many.
    Such a mark's median is of those runs alone (e.g. vpnw reads the broker's
    status to its end only when that end comes before vpnw is done), so its
    place in the budget is not an order."""
    seen = collections.Counter(k for run in runs for k in run)
    return {"of": len(runs), **{k: n for k, n in seen.items() if n < len(runs)}}


def print_startup(w, s: dict, verdict: str) -> None:
    w(f"\nstart-up: vpnw run -- true, ms over true ({s['true_ms']:.1f} ms)   target: {verdict}\n")
    revs = list(s["against"])
    off = s.get("tricks_off")
    w(f"    {'':<24} {'this tree':>10}" + (f" {TRICKS_OFF:>12} {'on/off':>7}" if off else "")
      + "".join(f" {'@' + r:>12} {'new/old':>7}" for r in revs) + "\n")
    for way, over in s["over_ms"].items():
        row = f"    {way:<24} {over:10.1f}"
        if off:
            off_ms = off["over_ms"][way]
            row += f" {off_ms:12.1f} {over / off_ms if off_ms else 0:7.2f}"
        for r in revs:
            old = s["against"][r]["over_ms"][way]
            row += (f" {old:12.1f} {over / old if old else 0:7.2f}" if old is not None
                    else f" {'(no such option)':>20}")
        w(row + "\n")
    for way in ("signed", "--record -"):
        marks = s["timeline_ms"].get(way) or {}
        if not marks:
            continue
        w(f"    the budget, {way} (median ms from the start of `vpnw` to each process's mark; "
          f"VPNW_STARTUP_TRACE)\n")
        last = 0.0
        seen = s.get("timeline_runs", {}).get(way, {})
        for k, at in marks.items():
            if not k.startswith("cpu: "):
                some = f"  (in {seen[k]} of {seen['of']} runs)" if k in seen else ""
                w(f"      {at:7.1f} {at - last:+6.1f}  {k}{some}\n")
                last = at
        w("      CPU ms each stage had used at its last mark: " + ", ".join(
            f"{k[5:]} {v:.1f}" for k, v in marks.items() if k.startswith("cpu: ")) + "\n")
        w(f"      {s['true_ms'] + s['over_ms'][way]:7.1f}          vpnw has exited (wall)\n")
        if off and off["cpu_ms"].get(way):
            w(f"      CPU ms with the tricks off ({TRICKS_VARIABLE}=off): " + ", ".join(
                f"{stage} {ms:.1f}" for stage, ms in off["cpu_ms"][way].items()) + "\n")


# ------------------------------------------------------------------ capture

CAPTURE = Way("vpnw capture door", None, None, ("--capture",))


def capture_way(rev: str | None = None) -> Way:
    """The capture door of this tree's vpnw, or of REV's (--against)."""
    return CAPTURE if rev is None else Way(f"{CAPTURE.label} @{rev}", None, None, CAPTURE.vpnw, None, rev)


def _has_capture(rev: str) -> bool:
    """Whether REV's vpnw knows --capture (it came in this round)."""
    done = subprocess.run([AGAINST[rev], "run", "--help"], capture_output=True, text=True)
    return "--capture" in done.stdout
DNS_QUERIES = r"""
import json, socket, struct, sys, time
n = int(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("127.0.0.1", 53))
s.settimeout(5)
took = []
t0 = time.perf_counter()
for i in range(n):
    q = (struct.pack("!HHHHHH", i & 0xFFFF, 0x0100, 1, 0, 0, 0) + b"\x08" + b"host%04d" % (i % 500)
         + b"\x05bench\x00" + struct.pack("!HH", 1, 1))
    t = time.perf_counter()
    s.send(q)
    s.recv(512)
    took.append(time.perf_counter() - t)
total = time.perf_counter() - t0
took.sort()
print(json.dumps({"qps": n / total, "p50_ms": took[n // 2] * 1e3, "p99_ms": took[n * 99 // 100] * 1e3}))
"""


# What the helper spends on capture, alone: the routes and the table made and
# read back (libnftables loaded in the process), and resolv.conf's bind.
CAPTURE_SETUP = r"""
import json, os, time
from stages.kernel import privileges as priv
uid, gid = os.getuid(), os.getgid()
priv.unshare(priv.CLONE_NEWUSER | priv.CLONE_NEWNET | priv.CLONE_NEWNS)
priv.write_id_maps(uid, gid)
priv.mount(None, "/", None, priv.MS_REC | priv.MS_PRIVATE)
from stages.helper import capture, netlink
from stages.wire import status   # loaded in a real helper long before (its status lines)
netlink.bring_up("lo")
t0 = time.perf_counter()
capture.install(1081, 53)
t1 = time.perf_counter()
capture.bind_resolv_conf()
t2 = time.perf_counter()
print(json.dumps({"install_ms": (t1 - t0) * 1e3, "resolv_ms": (t2 - t1) * 1e3}))
"""


def bench_capture(rounds: int, seconds: int, count: int) -> dict:
    """The capture door against the SOCKS door and direct, in the same rounds:
    latency one connection at a time (netload lat, to the sink) and new
    connections/s (netload conns, CLIENTS at a time, GET from nginx); the
    DNS door's answers (one client, queries in sequence); and the start-up
    cost of --capture (`vpnw run --capture -- true` against `vpnw run -- true`).
    With --against, each vpnw figure for REV too, in the same rounds (a REV
    without capture is left out of this section, said once)."""
    sink = subprocess.Popen([PYTHON, NETLOAD, "serve", str(SINK_PORT), CAPTURE_ADDR], stdout=subprocess.PIPE)
    PLACE.procs.append(sink)
    if sink.stdout.readline().strip() != b"ready":
        raise SystemExit("the capture sink did not start")
    revs = [None, *(rev for rev in AGAINST if _has_capture(rev))]
    lat_to, conns_to = {DIRECT: f"127.0.0.1:{SINK_PORT}"}, {DIRECT: f"127.0.0.1:{NGINX_PORT}"}
    for rev in revs:
        lat_to[vpnw_way("socks", rev=rev)] = f"bench.test:{SINK_PORT}"
        conns_to[vpnw_way("socks", rev=rev)] = f"bench.test:{NGINX_PORT}"
        lat_to[capture_way(rev)] = f"{CAPTURE_ADDR}:{SINK_PORT}"
        conns_to[capture_way(rev)] = f"{CAPTURE_ADDR}:{NGINX_PORT}"
    lat, conns, dns = {}, {}, {}
    record = os.path.join(PLACE.tmp, "capture-startup.jsonl")
    for _ in range(rounds):
        for way in lat_to:
            lat.setdefault(way.label, []).append(
                run_netload(["lat", "--to", lat_to[way], "--count", str(count)], way))
            conns.setdefault(way.label, []).append(
                run_netload(["conns", "--to", conns_to[way], "--get", SMALL_PATH, "--clients", str(CLIENTS),
                             "--seconds", str(seconds)], way))
        for rev in revs:
            out, _ = run_program([PYTHON, "-c", DNS_QUERIES, str(count * 4)], capture_way(rev))
            dns.setdefault(rev, []).append(json.loads(out.strip().splitlines()[-1]))
    startup = capture_startup(rounds, record, revs[1:])
    dns = {rev: {k: median([d[k] for d in dns[rev]]) for k in ("qps", "p50_ms", "p99_ms")} for rev in revs}
    return {
        **startup[None],
        "against": {rev: {**startup[rev], "dns": dns[rev]} for rev in revs[1:]},
        "without_capture": [rev for rev in AGAINST if rev not in revs],
        "lat": {label: {k: median([r[k] for r in rs]) for k in ("p50_ms", "p99_ms")} for label, rs in lat.items()},
        "conns": {label: {"rate": median([r["rate"] for r in rs]), "errors": sum(r["errors"] for r in rs)}
                  for label, rs in conns.items()},
        "dns": dns[None],
        "clients": CLIENTS, "count": count,
    }


def capture_startup(rounds: int, record: str, revs: list[str]) -> dict:
    """`vpnw run --capture -- true` against `vpnw run -- true`, this tree's
    and each --against REV's, interleaved; then what the helper alone spends
    on capture (CAPTURE_SETUP, in each build's own interpreter), interleaved."""
    builds = {None: VPNW, **{rev: AGAINST[rev] for rev in revs}}
    plain = {rev: [] for rev in builds}
    captured = {rev: [] for rev in builds}
    setup = {rev: [] for rev in builds}
    for i in range(rounds * 2 + 1):      # interleaved; the first pairs only warm the caches
        for rev, vpnw in builds.items():
            for argv, into in ((["run"], plain), (["run", "--capture"], captured)):
                t0 = time.perf_counter()
                subprocess.run([vpnw, *argv, "--record", record, "--", "true"], check=True,
                               stderr=subprocess.DEVNULL)
                if i:
                    into[rev].append((time.perf_counter() - t0) * 1e3)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record)
    for _ in range(rounds * 4):
        for rev, vpnw in builds.items():
            # This tree's modules from the checkout; REV's from its own venv.
            python, cwd = (PYTHON, ROOT) if rev is None else (os.path.join(os.path.dirname(vpnw), "python"), "/")
            setup[rev].append(json.loads(subprocess.run([python, "-c", CAPTURE_SETUP], check=True,
                                                        capture_output=True, text=True, cwd=cwd).stdout))
    return {rev: {"setup_ms": {k: median([x[k] for x in setup[rev]]) for k in ("install_ms", "resolv_ms")},
                  "startup": {"run_ms": median(plain[rev]), "capture_ms": median(captured[rev]),
                              "over_ms": median(captured[rev]) - median(plain[rev])}}
            for rev in builds}


def print_capture(w, c: dict) -> None:
    w(f"\ncapture: the capture door against the SOCKS door and direct (lat: one at a time, {c['count']} "
      f"connections; conns: {c['clients']} clients)\n"
      f"    {'':<26} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} {'conn/s':>8} {'x direct':>9}\n")
    base, rate = c["lat"]["direct"]["p50_ms"], c["conns"]["direct"]["rate"]
    for label, v in c["lat"].items():
        r = c["conns"][label]["rate"]
        w(f"    {label:<26} {v['p50_ms']:8.3f} {v['p99_ms']:8.3f} {v['p50_ms'] - base:10.3f} "
          f"{r:8.0f} {r / rate if rate else 0:9.2f}\n")
    d, s = c["dns"], c["startup"]
    w(f"    DNS door: {d['qps']:,.0f} answers/s (one client, in sequence), p50 {d['p50_ms']:.3f} ms, "
      f"p99 {d['p99_ms']:.3f} ms\n"
      f"    start-up: vpnw run --capture -- true {s['capture_ms']:.1f} ms, vpnw run -- true "
      f"{s['run_ms']:.1f} ms: capture costs {s['over_ms']:.1f} ms (target 10 ms); in the helper alone: "
      f"routes + table + read-back {c['setup_ms']['install_ms']:.1f} ms, resolv.conf "
      f"{c['setup_ms']['resolv_ms']:.1f} ms\n")
    for rev, r in c.get("against", {}).items():
        s = r["startup"]
        w(f"    start-up @{rev}: run --capture {s['capture_ms']:.1f} ms, run {s['run_ms']:.1f} ms: capture "
          f"costs {s['over_ms']:.1f} ms; helper alone: {r['setup_ms']['install_ms']:.1f} ms + resolv.conf "
          f"{r['setup_ms']['resolv_ms']:.1f} ms\n")
        w(f"    DNS door @{rev}: {r['dns']['qps']:,.0f} answers/s, p50 {r['dns']['p50_ms']:.3f} ms\n")
    for rev in c.get("without_capture", ()):
        w(f"    {rev}: its vpnw has no --capture; left out of these figures\n")


# ------------------------------------------------------------------ the targets

TARGETS = {
    "startup_over_true_ms": 100.0,    # vpnw run -- true, minus true
    "bulk_x_direct": 0.9,             # each door, one tunnel, curl's download (issue 33's line)
    "httpget_x_direct": 0.75,         # the HTTP door forwarding a plain GET, and a POST (netload's client)
    "conns_x_best_proxy": 1.0,        # conn/s >= the fastest Debian proxy of that door, same client
    "added_p50_ms": 0.3,              # CLIENTS clients, PACED_RATE connections a second (`paced`)
    "added_p99_ms": 1.0,
    "memory_mib": 60.0,               # vpnw's own processes, PSS, at their peak
}


def judge(res: dict) -> list[dict]:
    """Every figure that has a target: {section, row, figure, target, ok}.
    Pure: the results in, the verdicts out."""
    t, out = TARGETS, []

    def add(section, row, figure, target, ok):
        out.append({"section": section, "row": row, "figure": figure, "target": target, "ok": bool(ok)})

    if "startup" in res:
        for way, over in res["startup"]["over_ms"].items():
            add("startup", "vpnw run -- true" + ("" if way == "signed" else f" ({way})"),
                f"{over:.1f} ms over true", f"<= {t['startup_over_true_ms']:.0f} ms over true",
                over <= t["startup_over_true_ms"])
    if "bulk" in res:
        for label, v in res["bulk"].items():
            if label.startswith("vpnw") and "@" not in label and label.endswith(CURL):
                add("bulk", label, f"{v['x_direct']:.2f}x direct", f">= {t['bulk_x_direct']}x direct",
                    v["x_direct"] >= t["bulk_x_direct"])
    for row in ("vpnw http", "vpnw http (POST)"):
        if row in res.get("httpget", {}):
            x = res["httpget"][row]["x_direct"]
            add("httpget", row, f"{x:.2f}x direct", f">= {t['httpget_x_direct']}x direct",
                x >= t["httpget_x_direct"])
    if "conns" in res:
        for r in res["conns"]["rows"]:
            if r["kind"] != "vpnw":
                continue
            row = f"{r['label']} ({r['client']})"
            if r["x_best_proxy"] is not None:
                add("conns", row, f"{r['rate']:.0f}/s, {r['x_best_proxy']:.2f}x {r['best_proxy']}",
                    f">= {r['best_proxy']}", r["x_best_proxy"] >= t["conns_x_best_proxy"])
    if "paced" in res:
        for r in res["paced"]["rows"]:
            if r["kind"] == "vpnw":
                add("added", f"{r['label']} (paced)", f"+{r['added_p50_ms']:.3f} / +{r['added_p99_ms']:.3f} ms",
                    f"<= {t['added_p50_ms']} / {t['added_p99_ms']} ms (p50 / p99)",
                    r["added_p50_ms"] <= t["added_p50_ms"] and r["added_p99_ms"] <= t["added_p99_ms"])
    peaks = [(section, v.get("pss_mib"), v.get("rss_mib")) for section in ("bulk",) if section in res
             for label, v in res[section].items() if "@" not in label]
    if "conns" in res:
        peaks += [("conns", r["pss_mib"], r["rss_mib"]) for r in res["conns"]["rows"] if r["kind"] != "against"]
    if "leak" in res:
        peaks.append(("leak", res["leak"]["vpnw_pss_mib"]["held"], res["leak"]["vpnw_rss_mib"]["held"]))
    peaks = [p for p in peaks if p[1]]
    if peaks:
        section, pss, rss = max(peaks, key=lambda p: p[1])
        add("memory", f"vpnw's own, peak ({section})", f"PSS {pss:.1f} MiB (RSS sum {rss:.1f})",
            f"<= {t['memory_mib']:.0f} MiB", pss <= t["memory_mib"])
    if "leak" in res:
        leak = res["leak"]
        fds = leak["vpnw_fds"]
        add("leak", f"{leak['held']:,} held + {leak['sequential']:,} in sequence",
            "; ".join(leak["wrong"]) or f"fds {fds['before']} -> {fds['after']}, "
            f"{record_ends(leak['record']):,} of {leak['made']:,} ended",
            "no fd kept, record complete", not leak["wrong"])
    return out


def twin_label(label: str, rev: str) -> str:
    """The label REV's row of the same figure has: "vpnw http (curl)" ->
    "vpnw http @REV (curl)" (the way's label, then the client's)."""
    if label.endswith(")") and " (" in label:
        way, client = label.rsplit(" (", 1)
        return f"{way} @{rev} ({client}"
    return f"{label} @{rev}"


def compare_against(res: dict, rev: str) -> list[dict]:
    """Each of this tree's vpnw figures beside REV's: {section, row, new, old,
    unit, ratio} (ratio new / old; for a time, lower is better). Pure."""
    out = []

    def add(section, row, new, old, unit):
        if new is not None and old is not None:
            out.append({"section": section, "row": row, "new": new, "old": old, "unit": unit,
                        "ratio": new / old if old else None})

    if "startup" in res and rev in res["startup"].get("against", {}):
        s = res["startup"]
        for way, over in s["over_ms"].items():
            add("startup", f"vpnw run -- true, over true ({way})", over,
                s["against"][rev]["over_ms"][way], "ms")
        for way, stages in s.get("cpu_ms", {}).items():
            old = s["against"][rev].get("cpu_ms", {}).get(way, {})
            for stage, ms in stages.items():
                add("startup", f"CPU of {stage} ({way})", ms, old.get(stage), "ms CPU")
    for section, unit in (("bulk", "GB/s"), ("httpget", "GB/s")):
        for label, v in res.get(section, {}).items():
            if label.startswith("vpnw") and "@" not in label:
                add(section, label, v["gbps"], res[section].get(twin_label(label, rev), {}).get("gbps"), unit)
    for label, v in res.get("bulk", {}).items():
        old = res["bulk"].get(twin_label(label, rev))
        if label.startswith("vpnw") and "@" not in label and old:
            add("bulk", f"{label}, connect", v["handshake_ms"], old["handshake_ms"], "ms")
            add("bulk", f"{label}, after connect", v["tunnel_gbps"], old["tunnel_gbps"], "GB/s")
    if "conns" in res:
        rows = {(r["client"], r["label"]): r for r in res["conns"]["rows"]}
        for (client, label), r in rows.items():
            if r["kind"] == "vpnw":
                old = rows.get((client, twin_label(label, rev)))
                add("conns", f"{label} ({client})", r["rate"], old and old["rate"], "conn/s")
    if "paced" in res:
        rows = {r["label"]: r for r in res["paced"]["rows"]}
        for label, r in rows.items():
            if r["kind"] == "vpnw":
                old = rows.get(twin_label(label, rev))
                add("paced", f"{label}, added p50", r["added_p50_ms"], old and old["added_p50_ms"], "ms")
                add("paced", f"{label}, added p99", r["added_p99_ms"], old and old["added_p99_ms"], "ms")
    if "capture" in res and rev in res["capture"].get("against", {}):
        c, old = res["capture"], res["capture"]["against"][rev]
        add("capture", "run --capture -- true, over run -- true", c["startup"]["over_ms"],
            old["startup"]["over_ms"], "ms")
        for k in ("install_ms", "resolv_ms"):
            add("capture", f"helper alone: {k[:-3]}", c["setup_ms"][k], old["setup_ms"][k], "ms")
        base = c["lat"]["direct"]["p50_ms"]
        for label in ("vpnw socks5", CAPTURE.label):
            twin = twin_label(label, rev)
            add("capture", f"{label}, added p50", c["lat"][label]["p50_ms"] - base,
                c["lat"][twin]["p50_ms"] - base, "ms")
            add("capture", f"{label}, conn/s", c["conns"][label]["rate"], c["conns"][twin]["rate"], "conn/s")
        add("capture", "DNS door answers/s", c["dns"]["qps"], old["dns"]["qps"], "/s")
    if rev in res.get("leak", {}).get("against", {}):
        new, old = res["leak"], res["leak"]["against"][rev]
        add("leak", "PSS of vpnw's own, tunnels held", new["vpnw_pss_mib"]["held"], old["vpnw_pss_mib"]["held"],
            "MiB")
        add("leak", "open fds after - before", new["vpnw_fds"]["after"] - new["vpnw_fds"]["before"],
            old["vpnw_fds"]["after"] - old["vpnw_fds"]["before"], "fds")
    for label, v in res.get("lat", {}).items():
        if label.startswith("vpnw") and "@" not in label:
            old = res["lat"].get(twin_label(label, rev))
            add("lat", f"{label}, added p50", v["added_p50_ms"], old and old["added_p50_ms"], "ms")
    return out


def print_against(w, rev: str, rows: list[dict]) -> None:
    w(f"\nthis tree against {rev} (same rounds, interleaved)\n"
      f"    {'':<8} {'':<40} {'new':>10} {'old':>10}  {'':<6} {'new/old':>7}\n")
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else ""
        w(f"    {r['section']:<8} {r['row']:<40} {r['new']:10.3f} {r['old']:10.3f}  {r['unit']:<6} {ratio:>7}\n")


# ------------------------------------------------------------------ the table

def _mark(verdict: dict | None) -> str:
    return "" if verdict is None else "ok" if verdict["ok"] else "MISSED"


def _ms(value, places: int = 3) -> str:
    return "" if value is None else f"{value:.{places}f}"


def _label_width(labels, least: int) -> int:
    """The label column's width: `least`, or wider, so that no label runs
    into the next column (the --against and no-notifier rows are long)."""
    return max([least] + [len(label) + 1 for label in labels])


def _latency_table(w, title: str, rows: list[dict], target=None) -> None:
    """p50/p99 and what each adds to direct's; a target column when given."""
    lw = _label_width((r["label"] for r in rows), 28)
    w(f"\n{title}\n    {'':<{lw}}{'conn/s':>7} {'p50 ms':>8} {'p99 ms':>8}  {'added p50':>9} {'added p99':>9} "
      f"{'errors':>6}" + ("  target" if target else "") + "\n")
    for r in rows:
        w(f"    {r['label']:<{lw}}{r['rate']:7.0f} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f}  {r['added_p50_ms']:9.3f} "
          f"{r['added_p99_ms']:9.3f} {r['errors']:6d}" + (f"  {target(r)}" if target else "") + "\n")


def print_table(res: dict, meta: dict, verdicts: list[dict]) -> None:
    w = sys.stdout.write
    mark = {(v["section"], v["row"]): v for v in verdicts}
    w(f"vpnw benchmarks  ({meta['rounds']} rounds, medians; {meta['cpus']} CPUs, "
      f"load {meta['load']}; bulk {meta['size_mib']} MiB)\n")
    if "startup" in res:
        print_startup(w, res["startup"], _mark(mark.get(("startup", "vpnw run -- true"))))
    if "secrets" in res:
        secrets_bench.print_secrets(w, res["secrets"])
    if "bulk" in res:
        bw = _label_width(res["bulk"], 26)
        w(f"\n{'bulk, one transfer':<{bw + 4}}     GB/s   x direct  x relay   connect ms  after it x direct   "
          f"peak RSS / PSS of vpnw (MiB)   target\n")
        for label, v in res["bulk"].items():
            mem = f"{v['rss_mib']:.1f} / {v['pss_mib']:.1f}" if v.get("rss_mib") else ""
            relay = f"{v['x_reference']:7.2f}" if v.get("x_reference") is not None else " " * 7
            w(f"    {label:<{bw}} {v['gbps']:8.2f}   {v['x_direct']:6.2f}  {relay}   {v['handshake_ms']:9.1f}  "
              f"{v['tunnel_x_direct']:17.2f}   {mem:<29}  {_mark(mark.get(('bulk', label)))}\n")
        w(f"    {bulk_note(res['bulk'])}\n")
    if "httpget" in res:
        w(f"\nplain http:// GET from nginx;       GB/s   x direct   rounds (GB/s)   target\n"
          f"(POST): to netload's sink\n")
        for label, v in res["httpget"].items():
            each = " ".join(f"{g:.2f}" for g in v["rounds"])
            w(f"    {label:<26} {v['gbps']:8.2f}   {v['x_direct']:6.2f}     {each:<14}  "
              f"{_mark(mark.get(('httpget', label)))}\n")
    if "conns" in res:
        c = res["conns"]
        lw = _label_width((r["label"] for r in c["rows"]), 28)
        w(f"\nnew connections/s, {c['clients']} clients, {c['seconds']} s a round: connect, GET 64 B from nginx "
          f"by name, read to end, close\n"
          f"    {'':<{lw}}{'client':<8} {'conn/s':>7}  {'x direct':>8}  {'x best proxy':<24} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'errors':>6}  {'RSS / PSS MiB':<13}  target\n")
        for r in c["rows"]:
            best = f"{r['x_best_proxy']:.2f} {r['best_proxy']}" if r["x_best_proxy"] is not None else ""
            mem = f"{r['rss_mib']:.1f} / {r['pss_mib']:.1f}" if r.get("rss_mib") else ""
            places = 0 if r["client"] == "ab" else 3
            w(f"    {r['label']:<{lw}}{r['client']:<8} {r['rate']:7.0f}  {r['x_direct']:8.2f}  {best:<24} "
              f"{_ms(r['p50_ms'], places):>7} {_ms(r['p99_ms'], places):>7} {r['errors']:6d}  {mem:<13}  "
              f"{_mark(mark.get(('conns', r['label'] + ' (' + r['client'] + ')')))}\n")
        _latency_table(w, f"latency per connection at full speed, {c['clients']} clients (netload, minus "
                          f"direct's: mostly the wait for a turn, {c['clients']} / rate)",
                       [r for r in c["rows"] if r["client"] == "netload" and r["kind"] != "direct"])
    if "paced" in res:
        p = res["paced"]
        _latency_table(w, f"added latency per connection, {p['clients']} clients at {p['rate']:,} new "
                          f"connections a second in all (netload, {p['seconds']} s a round)",
                       p["rows"], lambda r: _mark(mark.get(("added", r["label"] + " (paced)"))))
    if "lat" in res:
        w(f"\nlatency per connection, one at a time (vpnw: allowed name + 10-rule policy)\n"
          f"                                 p50 ms   p99 ms   added p50   added p99\n")
        for label, v in res["lat"].items():
            w(f"    {label:<26} {v['p50_ms']:7.3f}  {v['p99_ms']:7.3f}   {v['added_p50_ms']:8.3f}    "
              f"{v['added_p99_ms']:8.3f}\n")
    if "leak" in res:
        leak = res["leak"]
        w(f"\nleak check: {leak['held']:,} tunnels held at once, then {leak['sequential']:,} GETs in sequence "
          f"(after a burst of {leak['warm']} through each door: the client made {leak['made']:,} connections, "
          f"{leak['client_errors']} errors)\n"
          f"    {'':<30}{'before':>8} {'held':>8} {'after':>8}\n")
        n, k = leak["processes"]["held"], leak["broker_processes"]
        for what, key, fmt in ((f"open fds, vpnw's {n} processes", "vpnw_fds", "{:8d}"),
                               (f"open fds, the broker ({k})", "broker_fds", "{:8d}"),
                               (f"RSS, the broker ({k}) MiB", "broker_rss_mib", "{:8.1f}"),
                               ("RSS sum, vpnw's own MiB", "vpnw_rss_mib", "{:8.1f}"),
                               ("PSS, vpnw's own MiB", "vpnw_pss_mib", "{:8.1f}")):
            w(f"    {what:<30}" + " ".join(fmt.format(leak[key][c]) for c in ("before", "held", "after")) + "\n")
        held = leak["broker_fd_kinds_held"]
        w("    the broker's fds while held: " + ", ".join(f"{n:,} {kind}" for kind, n in sorted(held.items())) + "\n")
        w("    record: " + ", ".join(f"{k} {v:,}" for k, v in sorted(leak["record"].items())) + "\n")
        for rev, old in leak.get("against", {}).items():
            w(f"    @{rev}: fds {old['vpnw_fds']['before']} -> {old['vpnw_fds']['held']} -> "
              f"{old['vpnw_fds']['after']}, PSS held {old['vpnw_pss_mib']['held']:.1f} MiB; "
              + ("; ".join(old["wrong"]) or "no fd kept, record complete") + "\n")
    if "capture" in res:
        print_capture(w, res["capture"])
    for rev, rows in meta.get("against", {}).items():
        print_against(w, rev, rows)
    if verdicts:
        w(f"\ntargets\n")
        rw = _label_width((v["row"] for v in verdicts), 36)
        for v in verdicts:
            w(f"    {v['section']:<8} {v['row']:<{rw}} {v['figure']:<46} {v['target']:<34} {_mark(v)}\n")


PLACE: Place
AGAINST: dict[str, str] = {}     # --against: REV -> its vpnw executable
WITHOUT_NOTIFIER = False         # --without-notifier
SECTIONS = ("startup", "bulk", "httpget", "conns", "paced", "lat", "leak", "capture", "secrets")


def main() -> None:
    global PLACE, WITHOUT_NOTIFIER
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer, smaller runs, for trying")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--rounds", type=int, help="runs per figure (default 5; --quick 3)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    ap.add_argument("--against", action="append", default=[], metavar="REV",
                    help="also run REV's vpnw (built into a venv of its own) and set each figure beside it")
    ap.add_argument("--without-notifier", action="store_true",
                    help="also run this tree's vpnw with --allow-unix-sockets: no Unix-socket "
                         "supervisor, so the figures show the notifier's own share")
    args = ap.parse_args()
    WITHOUT_NOTIFIER = args.without_notifier
    which = set(args.only.split(","))
    if which - set(SECTIONS):
        ap.error(f"--only: no section {', '.join(sorted(which - set(SECTIONS)))} (there are {', '.join(SECTIONS)})")
    if os.geteuid() != 0:
        raise SystemExit("the benchmarks need root (a private network namespace)")
    rounds = args.rounds or (3 if args.quick else 5)
    for rev in args.against:
        AGAINST[rev] = against.build(ROOT, rev)
    PLACE = Place(args.quick).start()
    res: dict = {}
    try:
        proxies = PLACE.start_proxies() if which & {"bulk", "httpget", "conns", "paced", "lat"} else {}
        if which & {"bulk", "httpget", "conns", "paced", "leak", "capture"}:
            PLACE.start_nginx()
        if "bulk" in which:
            PLACE.start_reference_relay()
        if "startup" in which:
            res["startup"] = bench_startup(rounds * 2)
        if "bulk" in which:
            res["bulk"] = bench_bulk(rounds, proxies)
        if "httpget" in which:
            res["httpget"] = bench_httpget(rounds, proxies)
        if "conns" in which:
            res["conns"] = bench_conns(rounds, proxies, 1 if args.quick else 2)
        if "paced" in which:
            res["paced"] = bench_paced(rounds, proxies, 1 if args.quick else 2)
        if "lat" in which:
            res["lat"] = bench_latency(rounds, proxies, 200 if args.quick else 500)
        if "leak" in which:
            res["leak"] = bench_leak()
            res["leak"]["against"] = {rev: bench_leak(rev) for rev in AGAINST}
        if "capture" in which:
            res["capture"] = bench_capture(rounds, 1 if args.quick else 2, 200 if args.quick else 500)
        if "secrets" in which:
            res["secrets"] = secrets_bench.bench_secrets(rounds, PYTHON, VPNW, PLACE.tmp, PLACE.procs,
                                                         64 if args.quick else 256)
    finally:
        PLACE.stop()
    meta = {"rounds": rounds, "cpus": os.cpu_count(), "load": " ".join(open("/proc/loadavg").read().split()[:3]),
            "size_mib": PLACE.size >> 20, "targets": TARGETS}
    meta["against"] = {rev: compare_against(res, rev) for rev in AGAINST}
    verdicts = judge(res)
    if args.json:
        print(json.dumps({"meta": meta, "results": res, "verdicts": verdicts}, indent=1))
    else:
        print_table(res, meta, verdicts)


if __name__ == "__main__":
    main()

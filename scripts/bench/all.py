"""vpnw's benchmarks, each side by side with its baseline in the same run.

    scripts/bench/run [--quick] [--json] [--only startup,bulk,httpget,conns,lat]

Needs root. The whole run happens in a private network + mount namespace made
for it (loopback only; /etc/hosts there names bench.test -> 127.0.0.1), so no
byte leaves loopback. The vpnw figures run the client INSIDE the sandbox
(`vpnw run -- netload.py ...`); the broker dials the sink on this namespace's
loopback. dante (SOCKS5) and squid (HTTP CONNECT) from Debian run on the same
loopback as the proxies people already use.

`httpget` is a plain http:// GET of the bulk file by curl from nginx (Debian's,
sendfile on) on the same loopback: direct, through vpnw's HTTP door (the
client in the sandbox, the door as its proxy: the forwarder, not a tunnel), and
through squid and tinyproxy. Two clients: netload's (recv_into one 4 MiB
buffer: the client never caps the figure) and curl (16 KiB reads: what a
person's download sees). Timed by the client from its request on, so vpnw's
start-up is not in the figure.

Figures are medians of --rounds runs (5; --quick: 3 rounds, 256 MiB, 1 s),
the variants interleaved round by round so machine noise hits all alike.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
VENV = os.environ.get("VPNW_VENV", "/opt/vpnw-venv")     # scripts/bench/run honours it too
PYTHON = f"{VENV}/bin/python"
VPNW = f"{VENV}/bin/vpnw"
NETLOAD = os.path.join(HERE, "netload.py")
SINK_PORT = 9000
DANTE_PORT, SQUID_PORT, TINYPROXY_PORT = 9180, 9128, 9188
NGINX_PORT = 9081
NGINX = "/usr/sbin/nginx"
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
        f.write("127.0.0.1 localhost bench.test\n::1 localhost\n")
    if libc.mount(hosts.encode(), b"/etc/hosts", None, MS_BIND, None) != 0:
        raise SystemExit(f"bind /etc/hosts: {os.strerror(ctypes.get_errno())}")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


class Place:
    def __init__(self, quick: bool):
        self.tmp = tempfile.mkdtemp(prefix="vpnw-bench-")
        os.chmod(self.tmp, 0o755)
        self.size = (256 if quick else 1024) << 20
        self.payload = f"/dev/shm/vpnw-bench-{os.getpid()}"
        self.procs: list[subprocess.Popen] = []
        self.exits = []
        self.policy = os.path.join(self.tmp, "bench.toml")
        with open(self.policy, "w") as f:
            f.write(f'version = 1\nname = "bench"\n[policy]\ndefault = "deny"\n'
                    f'allow = ["bench.test:{SINK_PORT}"]\n')

    def start(self) -> "Place":
        enter_private_namespace(self.tmp)
        with open(self.payload, "wb") as f:
            chunk = b"\0" * (1 << 20)
            for _ in range(self.size >> 20):
                f.write(chunk)
        os.chmod(self.payload, 0o644)
        sink = subprocess.Popen([PYTHON, NETLOAD, "serve", str(SINK_PORT)], stdout=subprocess.PIPE)
        self.procs.append(sink)
        if sink.stdout.readline().strip() != b"ready":
            raise SystemExit("the sink did not start")
        return self

    def start_nginx(self) -> bool:
        """nginx serving the bulk file as /payload (the origin for httpget)."""
        if not os.path.exists(NGINX):
            return False
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
    server {{ listen 127.0.0.1:{NGINX_PORT}; root {www}; }}
}}
""")
        proc = subprocess.Popen([NGINX, "-e", f"{self.tmp}/nginx-error.log", "-c", conf],
                                stdin=subprocess.DEVNULL)
        self.nginx = proc
        import exits
        if not exits.wait_listening(NGINX_PORT, proc):
            raise SystemExit(f"nginx did not start: see {self.tmp}/nginx-error.log")
        return True

    def start_proxies(self) -> dict:
        import exits
        found = {}
        for kind, port in (("danted", DANTE_PORT), ("squid", SQUID_PORT), ("tinyproxy", TINYPROXY_PORT)):
            if exits.missing(kind):
                continue
            e = exits.start_exit(kind, port, hosts={"bench.test": "127.0.0.1"})
            self.exits.append(e)
            found[kind] = port
        return found

    def stop(self) -> None:
        if getattr(self, "nginx", None) is not None:
            # SIGTERM to the master: it stops its worker (SIGKILL would orphan it).
            self.nginx.terminate()
            self.nginx.wait()
        for e in self.exits:
            e.stop()
        for p in self.procs:
            p.kill()
            p.wait()
        for path in (self.payload,):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


# ------------------------------------------------------------------ measuring

class RssSampler:
    """Peak memory of vpnw's own processes (orchestrator, recorder, broker,
    helper, init: every descendant of the vpnw process but the program)."""

    def __init__(self, root_pid: int, program_marker: str = "netload.py"):
        self.root = root_pid
        self.marker = program_marker
        self.peak_rss = self.peak_pss = 0
        self.peak_by_role: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self.sample()

    def sample(self) -> None:
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
        tree, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(children.get(pid, ()))
        rss = pss = 0
        for pid in tree:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                # The program (python netload.py ...), not the stages forked
                # from the orchestrator, whose argv also names netload.py.
                if len(argv) > 1 and argv[1].endswith(self.marker.encode()):
                    continue
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Rss:"):
                            rss += int(line.split()[1])
                        elif line.startswith("Pss:"):
                            pss += int(line.split()[1])
            except OSError:
                continue
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)


def run_client(args: list[str], *, vpnw: list[str] | None = None, sampler: bool = False):
    """Run netload with args, plain or inside `vpnw run`; its JSON (+ memory)."""
    cmd = [PYTHON, NETLOAD, *args]
    if vpnw is not None:
        cmd = [VPNW, "run", "--record", os.devnull, *vpnw, "--", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if sampler and vpnw is not None:
        with RssSampler(proc.pid) as s:
            out, err = proc.communicate(timeout=600)
        memory = (s.peak_rss, s.peak_pss)
    else:
        out, err = proc.communicate(timeout=600)
        memory = None
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:8])}... exited {proc.returncode}: {err.decode()[-800:]}")
    result = json.loads(out.decode().strip().splitlines()[-1])
    if memory:
        result["rss_kb"], result["pss_kb"] = memory
    return result


def variants(proxies: dict, with_policy: bool = False) -> list[tuple[str, list[str], list[str] | None]]:
    """(label, door args, vpnw args or None for a plain client)."""
    pol = ["--policy", PLACE.policy] if with_policy else []
    out = [("direct", [], None),
           ("vpnw http", ["--http", "3128"], pol),
           ("vpnw socks5", ["--socks", "1080"], pol)]
    if "danted" in proxies:
        out.append(("dante socks5", ["--socks", str(DANTE_PORT)], None))
    if "squid" in proxies:
        out.append(("squid http", ["--http", str(SQUID_PORT)], None))
    return out


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def bench_bulk(rounds: int, proxies: dict) -> dict:
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for label, door, vp in variants(proxies):
            r = run_client(["bulk", "--to", f"127.0.0.1:{SINK_PORT}", "--file", PLACE.payload, *door],
                           vpnw=vp, sampler=True)
            if r["received"] != r["bytes"]:
                raise RuntimeError(f"{label}: sent {r['bytes']} but the sink counted {r['received']}")
            runs.setdefault(label, []).append(r)
    out = {}
    for label, rs in runs.items():
        out[label] = {"gbps": median([r["gbps"] for r in rs]),
                      "rss_mib": max((r.get("rss_kb", 0) for r in rs), default=0) / 1024 or None,
                      "pss_mib": max((r.get("pss_kb", 0) for r in rs), default=0) / 1024 or None}
    direct = out["direct"]["gbps"]
    for v in out.values():
        v["x_direct"] = v["gbps"] / direct
    return out


def run_curl_get(url: str, proxy_port: int | None, vpnw: list[str] | None) -> dict:
    """curl GET url (through the HTTP proxy on proxy_port), inside `vpnw run`
    when vpnw is a list; curl's own figures."""
    cmd = ["curl", "-sS", "--fail", "-o", "/dev/null", "--noproxy", "" if proxy_port else "*",
           "-w", "%{size_download} %{speed_download} %{http_code}"]
    if proxy_port:
        cmd += ["-x", f"http://127.0.0.1:{proxy_port}"]
    cmd.append(url)
    if vpnw is not None:
        cmd = [VPNW, "run", "--record", os.devnull, *vpnw, "--", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:10])}... exited {proc.returncode}: {proc.stderr[-800:]}")
    size, speed, code = proc.stdout.split()
    return {"bytes": int(size), "gbps": float(speed) / 1e9, "status": int(code)}


def bench_httpget(rounds: int, proxies: dict) -> dict:
    """A plain http:// GET of the bulk file from nginx: direct, vpnw's HTTP
    door, squid, tinyproxy; the rounds interleaved."""
    url = f"http://127.0.0.1:{NGINX_PORT}/payload"
    ways = [("direct", None, None), ("vpnw http", 3128, [])]
    ways += [(f"{kind} http", port, None) for kind, port in
             (("squid", SQUID_PORT), ("tinyproxy", TINYPROXY_PORT)) if kind in proxies]
    runs: dict[str, list[float]] = {}
    for _ in range(rounds):
        for label, port, vp in ways:
            door = ["--http", str(port)] if port else []
            r = run_client(["get", "--to", f"127.0.0.1:{NGINX_PORT}", "--path", "/payload", *door], vpnw=vp)
            if r["bytes"] != PLACE.size:
                raise RuntimeError(f"{label}: {r['bytes']} of {PLACE.size} bytes")
            runs.setdefault(label, []).append(r["gbps"])
            r = run_curl_get(url, port, vp)
            if r["status"] != 200 or r["bytes"] != PLACE.size:
                raise RuntimeError(f"{label} (curl): status {r['status']}, {r['bytes']} of {PLACE.size} bytes")
            runs.setdefault(label + " (curl)", []).append(r["gbps"])
    out = {label: {"gbps": median(v), "rounds": v} for label, v in runs.items()}
    for label, v in out.items():
        base = out["direct (curl)" if label.endswith("(curl)") else "direct"]["gbps"]
        v["x_direct"] = v["gbps"] / base
    return dict(sorted(out.items(), key=lambda kv: kv[0].endswith("(curl)")))


def bench_conns(rounds: int, proxies: dict, seconds: float) -> dict:
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for label, door, vp in variants(proxies):
            r = run_client(["conns", "--to", f"127.0.0.1:{SINK_PORT}", "--clients", "50",
                            "--seconds", str(seconds), *door], vpnw=vp, sampler=True)
            runs.setdefault(label, []).append(r)
    out = {}
    for label, rs in runs.items():
        out[label] = {"rate": median([r["rate"] for r in rs]),
                      "errors": sum(r["errors"] for r in rs),
                      "p50_ms": median([r["p50_ms"] for r in rs]),
                      "p99_ms": median([r["p99_ms"] for r in rs]),
                      "rss_mib": max((r.get("rss_kb", 0) for r in rs), default=0) / 1024 or None,
                      "pss_mib": max((r.get("pss_kb", 0) for r in rs), default=0) / 1024 or None}
    direct = out["direct"]["rate"]
    for v in out.values():
        v["x_direct"] = v["rate"] / direct
    return out


def bench_latency(rounds: int, proxies: dict, count: int) -> dict:
    """One connection at a time to bench.test (a name: vpnw resolves it and the
    policy allows it); added = p50 minus direct's p50."""
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for label, door, vp in variants(proxies, with_policy=True):
            to = f"127.0.0.1:{SINK_PORT}" if label == "direct" else f"bench.test:{SINK_PORT}"
            r = run_client(["lat", "--to", to, "--count", str(count), *door], vpnw=vp)
            runs.setdefault(label, []).append(r)
    out = {label: {"p50_ms": median([r["p50_ms"] for r in rs]),
                   "p99_ms": median([r["p99_ms"] for r in rs])} for label, rs in runs.items()}
    base50, base99 = out["direct"]["p50_ms"], out["direct"]["p99_ms"]
    for v in out.values():
        v["added_p50_ms"] = v["p50_ms"] - base50
        v["added_p99_ms"] = v["p99_ms"] - base99
    return out


def _ts(record_ts: str) -> int:
    """The record's RFC 3339 nanosecond time -> ns since the epoch."""
    whole, frac = record_ts.rstrip("Z").split(".")
    secs = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(
        tzinfo=__import__("datetime").timezone.utc).timestamp()
    return int(secs) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])


def bench_startup(rounds: int) -> dict:
    """`vpnw run -- true` against `true`; each stage's share from the record."""
    record = os.path.join(PLACE.tmp, "startup.jsonl")
    walls, plain, stages = [], [], []
    for _ in range(rounds + 1):          # the first run only warms the page cache
        t0 = time.time_ns()
        subprocess.run(["true"], check=True)
        plain.append((time.time_ns() - t0) / 1e6)
        t0 = time.time_ns()
        subprocess.run([VPNW, "run", "--record", record, "--", "true"], check=True,
                       stderr=subprocess.DEVNULL)
        t_end = time.time_ns()
        walls.append((t_end - t0) / 1e6)
        with open(record) as f:
            at = {e["type"]: _ts(e["ts"]) for e in map(json.loads, f)}
        os.unlink(record)
        go = max(at["sandbox.ready"], at["path.check"])
        stages.append({
            "start-up to run.start (interpreter, imports, command line)": at["run.start"] - t0,
            "helper: seal ready (after run.start)": at["sandbox.ready"] - at["run.start"],
            "broker: path checked (after run.start)": at["path.check"] - at["run.start"],
            "program: go to program.exit": at["program.exit"] - go,
            "wind-down: program.exit to run.end": at["run.end"] - at["program.exit"],
            "recorder drain + exit after run.end": t_end - at["run.end"],
        })
    walls, plain, stages = walls[1:], plain[1:], stages[1:]
    return {"vpnw_ms": median(walls), "true_ms": median(plain),
            "stages_ms": {k: median([s[k] for s in stages]) / 1e6 for k in stages[0]}}


# ------------------------------------------------------------------ the table

TARGETS = {"bulk": 0.75, "httpget": 0.75, "conns": 0.45, "lat": 0.5, "startup": 150.0, "rss": 60.0}


def print_table(res: dict, meta: dict) -> None:
    w = sys.stdout.write
    w(f"vpnw benchmarks  ({meta['rounds']} rounds, medians; {meta['cpus']} CPUs, "
      f"load {meta['load']}; bulk {meta['size_mib']} MiB)\n")
    if "startup" in res:
        s = res["startup"]
        mark = "ok" if s["vpnw_ms"] <= TARGETS["startup"] else "MISSED"
        w(f"\nstart-up: vpnw run -- true {s['vpnw_ms']:.1f} ms   true {s['true_ms']:.1f} ms   "
          f"(target <= {TARGETS['startup']:.0f} ms: {mark})\n")
        for k, v in s["stages_ms"].items():
            w(f"    {k:<60} {v:7.1f} ms\n")
    if "bulk" in res:
        w(f"\nbulk, one transfer                GB/s   x direct   peak RSS / PSS of vpnw (MiB)\n")
        for label, v in res["bulk"].items():
            mem = f"{v['rss_mib']:.1f} / {v['pss_mib']:.1f}" if v.get("rss_mib") else ""
            w(f"    {label:<26} {v['gbps']:8.2f}   {v['x_direct']:6.2f}     {mem}\n")
    if "httpget" in res:
        w(f"\nplain http:// GET from nginx        GB/s   x direct   rounds (GB/s)\n")
        for label, v in res["httpget"].items():
            each = " ".join(f"{g:.2f}" for g in v["rounds"])
            w(f"    {label:<26} {v['gbps']:8.2f}   {v['x_direct']:6.2f}     {each}\n")
    if "conns" in res:
        w(f"\nconnections/s, 50 clients        conn/s   x direct   p50 ms   p99 ms  errors  peak RSS / PSS (MiB)\n")
        for label, v in res["conns"].items():
            mem = f"{v['rss_mib']:.1f} / {v['pss_mib']:.1f}" if v.get("rss_mib") else ""
            w(f"    {label:<26} {v['rate']:8.0f}   {v['x_direct']:6.2f}   {v['p50_ms']:6.2f}   "
              f"{v['p99_ms']:6.2f}  {v['errors']:5d}   {mem}\n")
    if "lat" in res:
        w(f"\nlatency per connection, one at a time (vpnw: allowed name + policy)\n"
          f"                                 p50 ms   p99 ms   added p50   added p99\n")
        for label, v in res["lat"].items():
            w(f"    {label:<26} {v['p50_ms']:7.3f}  {v['p99_ms']:7.3f}   {v['added_p50_ms']:8.3f}    "
              f"{v['added_p99_ms']:8.3f}\n")
    w("\ntargets: bulk >= 0.75x direct per door; plain http:// GET >= 0.75x direct; conn/s >= 0.45x direct; added p50 <= 0.5 ms; "
      "vpnw run -- true <= 150 ms; vpnw's own RSS <= 60 MiB\n")


PLACE: Place


def main() -> None:
    global PLACE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer, smaller runs, for trying")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--rounds", type=int, help="runs per figure (default 5; --quick 3)")
    ap.add_argument("--only", default="startup,bulk,httpget,conns,lat",
                    help="comma-separated: startup, bulk, httpget, conns, lat")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the benchmarks need root (a private network namespace)")
    rounds = args.rounds or (3 if args.quick else 5)
    which = set(args.only.split(","))
    PLACE = Place(args.quick).start()
    res: dict = {}
    try:
        proxies = PLACE.start_proxies() if which & {"bulk", "httpget", "conns", "lat"} else {}
        if "httpget" in which and not PLACE.start_nginx():
            raise SystemExit(f"httpget needs {NGINX} (nginx-light; scripts/setup installs it)")
        if "startup" in which:
            res["startup"] = bench_startup(rounds * 2)
        if "bulk" in which:
            res["bulk"] = bench_bulk(rounds, proxies)
        if "httpget" in which:
            res["httpget"] = bench_httpget(rounds, proxies)
        if "conns" in which:
            res["conns"] = bench_conns(rounds, proxies, 1.0 if args.quick else 3.0)
        if "lat" in which:
            res["lat"] = bench_latency(rounds, proxies, 200 if args.quick else 500)
    finally:
        PLACE.stop()
    meta = {"rounds": rounds, "cpus": os.cpu_count(), "load": " ".join(open("/proc/loadavg").read().split()[:3]),
            "size_mib": PLACE.size >> 20}
    if args.json:
        print(json.dumps({"meta": meta, "results": res}, indent=1))
    else:
        print_table(res, meta)


if __name__ == "__main__":
    main()

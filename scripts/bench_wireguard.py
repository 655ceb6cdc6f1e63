"""Benchmark: the WireGuard path, vpnw --via a wireguard path vs the same
wireguard-go tunnel used without vpnw.

Builds a test world (tests/world.py) with the WireGuard office of
tests/wg_support.py: Debian's wireguard-go as the peer in an office
namespace, and a plain TCP source on the tunnel's far side (10.66.0.1:9000).

  * "vpnw" rows: the client (bench_exits.py's) runs under
    `vpnw run --config --via office` and speaks SOCKS5 to vpnw's door; vpnw
    carries it through its own wireguard-go in its path namespace (with the
    UDP relay, stages/broker/wireguard/path_process.py).
  * "tunnel" rows: the same client, no vpnw, in a namespace routed through a
    second wireguard-go client of the same peer (kernel UDP socket, no relay):
    the tunnel's own cost.

Throughput: one connection that downloads SIZE bytes; connection rate: COUNT
short connections, CONCURRENCY at a time; both measured by the client from
its first connect to its last byte (vpnw's start-up is not counted).

    sudo /opt/vpnw-venv/bin/python scripts/bench_wireguard.py [--size-mib 1024]
        [--count 1000] [--concurrency 50] [--runs 3] [--json]

Needs root (namespaces). Every byte stays inside namespaces this script makes.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

from bench_exits import CLIENT_PROGRAM, SOURCE_PROGRAM, load_arguments, run_json  # noqa: E402
from wg_support import BENCH_TUNNEL, PEER_TUNNEL, SITE, Office  # noqa: E402
from world import World  # noqa: E402

SOURCE_PORT = 9000


def start_source(office: Office) -> subprocess.Popen:
    proc = subprocess.Popen(["nsenter", "-t", str(office.pid), "-n", "--", sys.executable, "-c",
                             SOURCE_PROGRAM, str(SOURCE_PORT)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    if proc.stdout.readline() != b"ready\n":
        raise RuntimeError("the source did not start")
    return proc


def start_baseline(world: World, office: Office) -> subprocess.Popen:
    """A namespace (net + mount, inside the world) routed through wireguard-go."""
    key = world.file("bench-wg.key", office.bench_key + "\n", mode=0o600)
    script = f"""set -e
ip link set lo up
mount -t tmpfs tmpfs /run && mkdir /run/wireguard
WG_PROCESS_FOREGROUND=1 LOG_LEVEL=error setpriv --pdeathsig KILL -- wireguard-go wgb &
for i in $(seq 200); do [ -S /run/wireguard/wgb.sock ] && break; sleep 0.02; done
wg set wgb private-key {key} peer {office.peer_public} endpoint {SITE}:51820 allowed-ips 10.66.0.0/24
ip address add {BENCH_TUNNEL}/32 dev wgb
ip link set wgb up
ip route add 10.66.0.0/24 dev wgb
echo ready
wait
"""
    # In the world's own network namespace (which the bench made): the
    # endpoint is reachable there, as it is for vpnw; a private mount
    # namespace keeps wireguard-go's socket file out of the machine.
    proc = subprocess.Popen(["nsenter", "-t", str(world.world_pid), "-n", "--", "unshare", "--mount",
                             "--propagation", "private", "--", "sh", "-c", script],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    if proc.stdout.readline() != b"ready\n":
        raise RuntimeError("the baseline tunnel did not start")
    return proc


def measure(world: World, client, config, way: str, args: list[str]) -> dict:
    target = f"{PEER_TUNNEL}:{SOURCE_PORT}"
    if way == "tunnel":
        cmd = [world.python, str(client), "none", "-", target, *args]
    else:
        cmd = [str(world.vpnw_path), "run", "--config", str(config), "--via", "office", "--",
               world.python, str(client), "socks", "127.0.0.1:1080", target, *args]
    return run_json(world, cmd, way, timeout=1200)


def main() -> int:
    options = load_arguments(__doc__, size_mib=1024, count=1000).parse_args()
    if os.geteuid() != 0:
        print("bench_wireguard.py needs root (it builds namespaces)", file=sys.stderr)
        return 2
    world = World().start()
    source = baseline = None
    try:
        office = Office(world)
        source = start_source(office)
        client = world.file("bench_client.py", CLIENT_PROGRAM)
        size = options.size_mib << 20
        results = {}
        # vpnw first: the baseline adds a route to the tunnel in the world.
        for way in ("vpnw", "tunnel"):
            if way == "tunnel":
                baseline = start_baseline(world, office)
            tput, rate = [], []
            for _ in range(options.runs):
                tput.append(measure(world, client, office.config, way, ["bytes", str(size)])["mib_s"])
                rate.append(measure(world, client, office.config, way,
                                    ["conns", str(options.count), str(options.concurrency)])["conn_s"])
            results[way] = {"mib_s": statistics.median(tput), "conn_s": statistics.median(rate),
                            "mib_s_runs": tput, "conn_s_runs": rate}
            if not options.json:
                print(f"  measured {way}", file=sys.stderr, flush=True)
        setup = {"size_mib": options.size_mib, "count": options.count,
                 "concurrency": options.concurrency, "runs": options.runs, "cpus": os.cpu_count()}
        if options.json:
            print(json.dumps({"setup": setup, "results": results}, indent=2))
        else:
            print(f"\nmedians of {options.runs} runs; {options.size_mib} MiB in one connection; "
                  f"{options.count} connections, {options.concurrency} at a time; {os.cpu_count()} CPUs")
            print(f"{'how':<34} {'MiB/s':>9} {'conn/s':>9}")
            print(f"{'wireguard-go tunnel, no vpnw':<34} {results['tunnel']['mib_s']:>9.1f} "
                  f"{results['tunnel']['conn_s']:>9.0f}")
            print(f"{'vpnw --via office (wireguard)':<34} {results['vpnw']['mib_s']:>9.1f} "
                  f"{results['vpnw']['conn_s']:>9.0f}")
            print(f"{'vpnw / without':<34} {results['vpnw']['mib_s'] / results['tunnel']['mib_s']:>9.2f} "
                  f"{results['vpnw']['conn_s'] / results['tunnel']['conn_s']:>9.2f}")
        return 0
    finally:
        for proc in (source, baseline):
            if proc is not None:
                proc.kill()
                proc.wait()
        world.stop()


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: real exits used directly by a client vs through `vpnw --via` that exit.

Builds a test world (tests/world.py) with an office network namespace holding
danted, microsocks, tinyproxy and squid (no authentication), and a plain TCP
source in the world's internet namespace. A client program inside the world
measures, from its own first connect to its last byte (so vpnw's start-up is
not counted):

  * throughput: one connection that downloads SIZE bytes;
  * connection rate: COUNT short connections (each: proxy handshake, 1 byte
    down, close), CONCURRENCY at a time.

"exit" rows: the client speaks SOCKS5 / HTTP CONNECT to the exit itself.
"vpnw" rows: the client runs under `vpnw run --config --via EXIT` and speaks
the same protocol to vpnw's door; vpnw carries it through the exit.
"direct" is the baseline with no exit: the client straight to the source, and
`vpnw run --via direct`.

    sudo /opt/vpnw-venv/bin/python scripts/bench_exits.py [--size-mib 256]
        [--count 2000] [--concurrency 50] [--runs 3] [--json]

Needs root (namespaces). Every byte stays inside namespaces this script makes.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import exits  # noqa: E402
from world import DNS_ADDR, World  # noqa: E402

SITE = "10.8.0.1"
SOURCE = ("198.18.0.9", 9000)     # RFC 2544 benchmarking range; the internet answers for it
EXITS = [("danted", 1080, "socks"), ("microsocks", 1081, "socks"),
         ("tinyproxy", 3128, "http"), ("squid", 3130, "http")]

# The source: for each connection, read "N\n", send N bytes, close.
SOURCE_PROGRAM = r"""
import os, socket, sys, tempfile, threading
# sendfile from a 1 MiB file in the page cache: the source must not be what limits throughput.
blockfile = tempfile.TemporaryFile()
blockfile.write(bytes(1 << 20)); blockfile.flush()
def serve(conn):
    with conn:
        line = b""
        while not line.endswith(b"\n"):
            data = conn.recv(64)
            if not data:
                return
            line += data
        left = int(line)
        while left > 0:
            left -= os.sendfile(conn.fileno(), blockfile.fileno(), 0, min(left, 1 << 20))
server = socket.create_server(("0.0.0.0", int(sys.argv[1])), backlog=1024)
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

# The client: speaks SOCKS5 or HTTP CONNECT to a proxy (or nothing, for
# direct) and prints one JSON object with what it measured.
CLIENT_PROGRAM = r"""
import asyncio, json, socket, sys, time
kind, proxy, target, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
thost, tport = target.rsplit(":", 1); tport = int(tport)

async def open_through():
    if kind == "none":
        return await asyncio.open_connection(thost, tport, limit=1 << 20)
    phost, pport = proxy.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(phost, int(pport), limit=1 << 20)
    if kind == "socks":
        writer.write(b"\x05\x01\x00")
        if await reader.readexactly(2) != b"\x05\x00":
            raise SystemExit("socks greeting refused")
        writer.write(b"\x05\x01\x00\x01" + socket.inet_aton(thost) + tport.to_bytes(2, "big"))
        head = await reader.readexactly(4)
        if head[1] != 0:
            raise SystemExit(f"socks connect failed: {head[1]}")
        await reader.readexactly({1: 4, 4: 16}[head[3]] + 2)
    else:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200" not in head.split(b"\r\n", 1)[0]:
            raise SystemExit(f"CONNECT failed: {head[:60]!r}")
    return reader, writer

async def fetch(n):
    reader, writer = await open_through()
    writer.write(b"%d\n" % n)
    got = 0
    while got < n:
        data = await reader.read(1 << 20)
        if not data:
            raise SystemExit(f"short read {got}/{n}")
        got += len(data)
    writer.close()
    return got

def fetch_blocking(n):
    # Plain sockets and recv_into: the client must not be what limits throughput.
    if kind == "none":
        sock = socket.create_connection((thost, tport))
    else:
        phost, pport = proxy.rsplit(":", 1)
        sock = socket.create_connection((phost, int(pport)))
        if kind == "socks":
            sock.sendall(b"\x05\x01\x00")
            assert sock.recv(2) == b"\x05\x00"
            sock.sendall(b"\x05\x01\x00\x01" + socket.inet_aton(thost) + tport.to_bytes(2, "big"))
            reply = b""
            while len(reply) < 10:
                reply += sock.recv(10 - len(reply))
            assert reply[1] == 0 and reply[3] == 1, reply
        else:
            sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += sock.recv(1)
            assert b" 200" in head.split(b"\r\n", 1)[0], head
    sock.sendall(b"%d\n" % n)
    buffer = bytearray(1 << 20)
    got = 0
    while got < n:
        k = sock.recv_into(buffer)
        if not k:
            raise SystemExit(f"short read {got}/{n}")
        got += k
    sock.close()

async def main():
    if mode == "bytes":
        size = int(sys.argv[5])
        start = time.perf_counter()
        fetch_blocking(size)
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "mib_s": size / seconds / (1 << 20)}))
    else:
        count, concurrency = int(sys.argv[5]), int(sys.argv[6])
        gate = asyncio.Semaphore(concurrency)
        async def one():
            async with gate:
                await fetch(1)
        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(count)))
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "conn_s": count / seconds}))

asyncio.run(main())
"""


def start_source(world: World) -> subprocess.Popen:
    proc = subprocess.Popen(["nsenter", "-t", str(world.internet_pid), "-n", "--", world.python, "-c",
                             SOURCE_PROGRAM, str(SOURCE[1])], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    if proc.stdout.readline() != b"ready\n":
        raise RuntimeError("the source did not start")
    return proc


def config_text() -> str:
    lines = ['version = 1', 'name = "bench"']
    for kind, port, proto in EXITS:
        scheme = "socks5h" if proto == "socks" else "http"
        lines += ["", f"[paths.{kind}]", 'type = "proxy"', f'url = "{scheme}://{SITE}:{port}"']
    return "\n".join(lines) + "\n"


def measure(world: World, client, config, row: str, way: str, proto: str, args: list[str]) -> dict:
    target = f"{SOURCE[0]}:{SOURCE[1]}"
    if way == "exit":
        port = {k: p for k, p, _ in EXITS}.get(row)
        cmd = [world.python, str(client), proto if row != "direct" else "none", f"{SITE}:{port}", target, *args]
    else:
        door = "127.0.0.1:1080" if proto == "socks" else "127.0.0.1:3128"
        cmd = [str(world.vpnw_path), "run", "--config", str(config), "--via", row, "--",
               world.python, str(client), proto if row != "direct" else "socks", door, target, *args]
    return run_json(world, cmd, f"{row}/{way}", timeout=600)


def run_json(world: World, cmd: list, what: str, *, timeout: float) -> dict:
    """Run a bench client in the world; the JSON object on its last line."""
    result = world.run(cmd, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{what}: exit {result.returncode}\n{result.stdout}\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def load_arguments(doc: str, *, size_mib: int, count: int) -> argparse.ArgumentParser:
    """The options every bench of a path shares: bulk size, connection count,
    concurrency, runs, --json."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=size_mib)
    parser.add_argument("--count", type=int, default=count)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    return parser


def main() -> int:
    parser = load_arguments(__doc__, size_mib=256, count=2000)
    parser.add_argument("--only", help="comma-separated rows (direct, danted, microsocks, tinyproxy, squid)")
    options = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_exits.py needs root (it builds namespaces)", file=sys.stderr)
        return 2

    world = World().start()
    started, source, netns = [], None, None
    try:
        netns = exits.PrivateNetns(join_pid=world.exit_site(SITE))
        rows = [("direct", "socks")]
        for kind, port, proto in EXITS:
            if exits.missing(kind):
                print(f"skipping {kind}: {exits.missing(kind)}", file=sys.stderr)
                continue
            started.append(netns.run(functools.partial(exits.start_exit, kind, port, listen=SITE,
                                                       resolver=DNS_ADDR)))
            rows.append((kind, proto))
        if options.only:
            wanted = set(options.only.split(","))
            rows = [r for r in rows if r[0] in wanted]
        source = start_source(world)
        client = world.file("bench_client.py", CLIENT_PROGRAM)
        config = world.file("bench.toml", config_text())
        size = options.size_mib << 20

        results = []
        for row, proto in rows:
            for way in ("exit", "vpnw"):
                tput, rate = [], []
                for _ in range(options.runs):
                    tput.append(measure(world, client, config, row, way, proto, ["bytes", str(size)])["mib_s"])
                    rate.append(measure(world, client, config, row, way, proto,
                                        ["conns", str(options.count), str(options.concurrency)])["conn_s"])
                results.append({"exit": row, "way": way, "protocol": proto if row != "direct" else None,
                                "mib_s": statistics.median(tput), "conn_s": statistics.median(rate),
                                "mib_s_runs": tput, "conn_s_runs": rate})
                if not options.json:
                    print(f"  measured {row}/{way}", file=sys.stderr, flush=True)
        setup = {"size_mib": options.size_mib, "count": options.count,
                 "concurrency": options.concurrency, "runs": options.runs, "cpus": os.cpu_count()}
        if options.json:
            print(json.dumps({"setup": setup, "results": results}, indent=2))
        else:
            print(f"\nmedians of {options.runs} runs; {options.size_mib} MiB in one connection; "
                  f"{options.count} connections, {options.concurrency} at a time; {os.cpu_count()} CPUs")
            print(f"{'exit':<11} {'how':<24} {'MiB/s':>9} {'conn/s':>9}")
            by = {(r["exit"], r["way"]): r for r in results}
            for row, proto in rows:
                for way in ("exit", "vpnw"):
                    r = by[(row, way)]
                    how = ("client -> source" if row == "direct" else f"client -> {row}") if way == "exit" \
                        else f"vpnw --via {row}"
                    print(f"{row:<11} {how:<24} {r['mib_s']:>9.0f} {r['conn_s']:>9.0f}")
                base, through = by[(row, "exit")], by[(row, "vpnw")]
                print(f"{'':<11} {'vpnw / without':<24} {through['mib_s'] / base['mib_s']:>9.2f} "
                      f"{through['conn_s'] / base['conn_s']:>9.2f}")
        return 0
    finally:
        if source is not None:
            source.kill()
            source.wait()
        for exit_ in started:
            exit_.stop()
        if netns is not None:
            netns.close()
        world.stop()


if __name__ == "__main__":
    sys.exit(main())

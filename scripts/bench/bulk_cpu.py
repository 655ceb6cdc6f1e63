"""Where a bulk upload's CPU goes, per process: the figure that holds under load.

    scripts/bench/bulk_cpu [--mib 1024] [--rounds 5]

Needs root (a private network namespace, loopback only, as all.py's). One
upload of a file from tmpfs to netload's sink (sendfile in, recv_into 4 MiB
out, all.py's `bulk` client and sink), three ways, rounds interleaved:

  direct             client -> sink
  splice relay (C)   client -> splice_relay.c -> sink (the bench's bound)
  vpnw's relay       client -> stages.broker.relay.Relay in a bare asyncio
                     loop (the installed vpnw's, as the broker runs it for a
                     tunnel after its handshake) -> sink

For each: the throughput (median, and the best round: under load only the
best says much), and each process's CPU seconds per GiB (min of the rounds:
CPU time is what the machine's other load changes least) with its context
switches per GiB (voluntary: it slept for want of data or room; involuntary:
it was put off the CPU) and its wait for a CPU while runnable, ms per GiB
(/proc/PID/schedstat: the scheduling share of the loss); neither is shown
for the C relay, whose threads end with each connection and take their
counts with them. On 2 cores the sum of CPU seconds bounds the
throughput: three busy processes share two cores, and the third pays in
waits and colder caches (the sink's copy costs more per byte behind any
relay). No vpnw run is started: this is the relay alone, no policy, no record.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.environ.get("VPNW_VENV", "/opt/vpnw-venv")
PYTHON = f"{VENV}/bin/python"
NETLOAD = os.path.join(HERE, "netload.py")
SINK, C_RELAY, PY_RELAY = 9000, 9001, 9002
WAYS = {"direct": SINK, "splice relay (C)": C_RELAY, "vpnw's relay": PY_RELAY}


def serve_relay(port: int, target: int) -> None:
    """`bulk_cpu.py relay PORT TARGET`: vpnw's Relay between each accepted
    connection and a new one to TARGET, in a bare asyncio loop (run by the
    venv's interpreter, so the installed vpnw's relay.py)."""
    import asyncio
    from stages.broker.relay import Relay

    async def main() -> None:
        loop = asyncio.get_running_loop()
        listener = socket.create_server(("127.0.0.1", port), backlog=64)
        listener.setblocking(False)
        print("ready", flush=True)
        while True:
            client, _ = await loop.sock_accept(listener)
            upstream = socket.socket()
            upstream.setblocking(False)
            await loop.sock_connect(upstream, ("127.0.0.1", target))
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # as the broker's dial
            Relay(client, upstream, loop).start()

    asyncio.run(main())


def process_cpu(pid: int) -> tuple[float, int, int, float]:
    """(CPU seconds, its ended threads' included; voluntary and involuntary
    context switches and seconds runnable but waiting for a CPU, of its main
    thread) of a live process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    switches = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if "ctxt_switches" in line:
                key, value = line.split(":")
                switches[key] = int(value)
    with open(f"/proc/{pid}/schedstat") as f:
        waited_ns = int(f.read().split()[1])
    return ((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
            switches["voluntary_ctxt_switches"], switches["nonvoluntary_ctxt_switches"], waited_ns / 1e9)


def start(argv: list[str]) -> subprocess.Popen:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE)
    if process.stdout.readline().strip() != b"ready":
        raise SystemExit(f"did not start: {' '.join(argv)}")
    return process


def one_upload(port: int, payload: str, watched: dict[str, int]) -> dict:
    """One upload through `port`; GB/s and each watched process's deltas."""
    before = {name: process_cpu(pid) for name, pid in watched.items()}
    times = os.times()
    out = subprocess.run([PYTHON, NETLOAD, "bulk", "--to", f"127.0.0.1:{port}", "--file", payload],
                         capture_output=True, text=True, check=True).stdout
    after_times = os.times()
    result = json.loads(out.strip().splitlines()[-1])
    if result["received"] != result["bytes"]:
        raise RuntimeError(f"port {port}: sent {result['bytes']}, the sink counted {result['received']}")
    row = {"gbps": result["gbps"], "client": (after_times.children_user + after_times.children_system
                                              - times.children_user - times.children_system, 0, 0, 0.0)}
    for name, pid in watched.items():
        row[name] = tuple(a - b for a, b in zip(process_cpu(pid), before[name]))
    return row


def figures(rows: list[dict], gib: float) -> dict:
    """Per way: GB/s (median, best); per process CPU s/GiB (min) and context
    switches and ms waited for a CPU per GiB (median). Pure."""
    out = {"gbps": statistics.median(r["gbps"] for r in rows), "best_gbps": max(r["gbps"] for r in rows)}
    for name in ("client", "relay", "sink"):
        if name in rows[0]:
            out[name] = {"cpu": min(r[name][0] for r in rows) / gib,
                         "voluntary": statistics.median(r[name][1] for r in rows) / gib,
                         "involuntary": statistics.median(r[name][2] for r in rows) / gib,
                         "waited_ms": statistics.median(r[name][3] for r in rows) * 1e3 / gib}
    out["cpu_sum"] = sum(out[name]["cpu"] for name in ("client", "relay", "sink") if name in out)
    return out


def measure(mib: int, rounds: int, tmp: str) -> dict:
    payload = os.path.join(tmp, "payload")
    with open(payload, "wb") as f:
        for _ in range(mib):
            f.write(b"\0" * (1 << 20))
    relay = os.path.join(tmp, "splice_relay")
    subprocess.run(["gcc", "-O2", "-pthread", "-o", relay, os.path.join(HERE, "splice_relay.c")], check=True)
    procs = [start([PYTHON, NETLOAD, "serve", str(SINK)]),
             start([relay, str(C_RELAY), str(SINK)]),
             start([PYTHON, os.path.abspath(__file__), "relay", str(PY_RELAY), str(SINK)])]
    relays = {"direct": None, "splice relay (C)": procs[1].pid, "vpnw's relay": procs[2].pid}
    try:
        rows: dict[str, list[dict]] = {way: [] for way in WAYS}
        for _ in range(rounds):
            for way, port in WAYS.items():
                watched = {"sink": procs[0].pid, **({"relay": relays[way]} if relays[way] else {})}
                rows[way].append(one_upload(port, payload, watched))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return {way: figures(r, mib / 1024) for way, r in rows.items()}


def print_table(res: dict, meta: str) -> None:
    w = sys.stdout.write
    w(f"bulk upload, CPU per GiB ({meta})\n"
      f"    {'':<20}{'GB/s':>6} {'best':>6}  {'CPU s/GiB: client':>17} {'relay':>6} {'sink':>6} {'sum':>6}"
      f"   per GiB: relay switches vol / invol, waited ms   sink's\n")
    for way, v in res.items():
        relay = v.get("relay")
        counted = relay and way != "splice relay (C)"
        w(f"    {way:<20}{v['gbps']:6.2f} {v['best_gbps']:6.2f}  {v['client']['cpu']:17.3f} "
          f"{relay['cpu'] if relay else 0:6.3f} {v['sink']['cpu']:6.3f} {v['cpu_sum']:6.3f}   "
          + (f"{relay['voluntary']:10.0f} / {relay['involuntary']:<5.0f} {relay['waited_ms']:7.0f}"
             if counted else " " * 26)
          + f"      {v['sink']['voluntary']:5.0f} / {v['sink']['involuntary']:<5.0f} {v['sink']['waited_ms']:6.0f}\n")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "relay":
        serve_relay(int(sys.argv[2]), int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bulk_cpu needs root (a private network namespace)")
    if shutil.which("gcc") is None:
        raise SystemExit("bulk_cpu needs gcc (scripts/setup installs it)")
    sys.path.insert(0, HERE)
    import all as bench     # noqa: E402  (all.py: the same private namespace)
    tmp = tempfile.mkdtemp(prefix="vpnw-bulk-cpu-", dir="/dev/shm")
    try:
        bench.enter_private_namespace(tmp)
        res = measure(args.mib, args.rounds, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print_table(res, f"{args.rounds} rounds, {args.mib} MiB, {os.cpu_count()} CPUs, load {load}")


if __name__ == "__main__":
    main()

"""Benchmark: what the signed end and the ledger cost (issue 30).

1. `vpnw run -- true`, interleaved: `--record -` (nothing to sign) against
   the record in the state directory (signed, entered in the ledger), the
   same vpnw otherwise: the wall time a person waits, and the CPU time.
2. The recorder's end alone (stages/recorder/seal.py: the file read again
   and hashed, two signatures, the ledger line under flock, the .minisig),
   on run files of a few lines and of many, libsodium already loaded (the
   recorder loads it when it opens the key, before the program starts).
3. `vpnw show --verify`'s check (stages/record/evidence.py) on the same
   files.
4. What loading the signing library costs a process that has ctypes (every
   stage has): libsodium through ctypes, and, for comparison, importing the
   `cryptography` package's Ed25519 (what signed runs before, when installed).

    /opt/vpnw-venv/bin/python scripts/bench_evidence.py [ROUNDS]     (as root)

It runs in a network namespace of its own, loopback down and no route, so
the runs it starts can reach nothing (`true` asks for nothing anyway).

Nothing is added per event: the recorder's loop is unchanged but for
remembering the first and the last event of each batch it reads.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)


def startup(rounds: int) -> dict:
    """`vpnw run -- true`, interleaved: the record to stdout (not signed:
    nothing to sign, no ledger line) against the record in the state
    directory (signed, entered in the ledger), the same code otherwise.
    Wall time, and CPU time of vpnw and all its processes."""
    import resource
    vpnw = os.path.join(os.path.dirname(sys.executable), "vpnw")
    runs = {"unsigned": ["run", "--record", "-", "--", "true"], "signed": ["run", "--", "true"]}
    wall = {name: [] for name in runs}
    cpu = {name: [] for name in runs}
    marks = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace")
        env = dict(os.environ, XDG_STATE_HOME=tmp, VPNW_STARTUP_TRACE=trace)
        for i in range(rounds + 1):
            for name in runs if i % 2 else reversed(list(runs)):
                if os.path.exists(trace):
                    os.unlink(trace)
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                subprocess.run([vpnw, *runs[name]], env=env, check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                took = (time.perf_counter() - t0) * 1000
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if i:                       # the first round warms the page cache
                    wall[name].append(took)
                    cpu[name].append((after.ru_utime + after.ru_stime - before.ru_utime
                                      - before.ru_stime) * 1000)
                    if name == "signed":
                        marks.append(read_marks(trace))
    found = {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in runs}
    return found, signing_share(marks)


def read_marks(path: str) -> dict[str, tuple[int, int]]:
    """stages/startup/trace.py's file: "stage: what" -> (its first
    monotonic ns, the CPU us its process had used by then)."""
    found: dict[str, tuple[int, int]] = {}
    with open(path) as f:
        for line in f:
            ns, _pid, cpu_us, stage, what = line.rstrip("\n").split(" ", 4)
            found.setdefault(f"{stage}: {what}", (int(ns), int(cpu_us)))
    return found


def signing_share(marks: list[dict[str, tuple[int, int]]]) -> dict[str, float]:
    """What signing takes of a signed run, from the recorder's own marks
    (medians, ms, wall and the recorder's CPU): at the end, on the way to
    vpnw's exit (the signature and the ledger line after the last event); at
    the start, the key and the ledger opened (the signing code imported,
    libsodium loaded), and how often the recorder was the last one the
    program waited for (its run.start after the helper's Ready)."""
    def ms(m, a, b):
        return (m[b][0] - m[a][0]) / 1e6

    def cpu(m, a, b):
        return (m[b][1] - m[a][1]) / 1e3
    whole = [m for m in marks if {"recorder: events ended", "recorder: signed", "recorder: imported",
                                  "recorder: key and ledger opened", "recorder: run.start written",
                                  "helper: Ready sent"} <= m.keys()]
    if not whole:
        return {}
    end, start = ("recorder: events ended", "recorder: signed"), ("recorder: imported",
                                                                  "recorder: key and ledger opened")
    return {"end_ms": statistics.median(ms(m, *end) for m in whole),
            "end_cpu": statistics.median(cpu(m, *end) for m in whole),
            "open_ms": statistics.median(ms(m, *start) for m in whole),
            "open_cpu": statistics.median(cpu(m, *start) for m in whole),
            "recorder_last": sum(m["recorder: run.start written"] > m["helper: Ready sent"] for m in whole)
            / len(whole)}


def run_file(path: str, events: int) -> None:
    from stages.record.chain import Chain
    from stages.record.events import encode
    chain = Chain()
    _encode = encode

    def encode(*args, **kw):
        return _encode(*args, **kw).rstrip(b"\n")
    with open(path, "wb") as out:
        out.write(chain.seal(encode("r-bench0", "run.start", {"mode": "run"})) + b"\n")
        for n in range(events):
            out.write(chain.seal(encode("r-bench0", "conn.request", {"door": "http", "kind": "http-connect",
                                                                    "host": "api.github.com", "port": 443},
                                        conn=n + 1)) + b"\n")
        out.write(chain.seal(encode("r-bench0", "run.end", {"exit_code": 0, "connections": events,
                                                           "denied": 0, "would_deny": 0, "failed": 0,
                                                           "ms": 1.0})) + b"\n")


def seal_and_verify(rounds: int) -> list[tuple[int, float, float, float]]:
    import orjson
    from stages.record import evidence, ledger, signing
    from stages.recorder.seal import Sealer
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_STATE_HOME"] = tmp
        sealer = Sealer.open()
        for events in (3, 1_000, 100_000):
            path = os.path.join(tmp, f"run-{events}.jsonl")
            run_file(path, events)
            with open(path, "rb") as f:
                lines = f.readlines()
            start, end = orjson.loads(lines[0]), orjson.loads(lines[-1])
            seals, checks = [], []
            for i in range(rounds):
                # A file of its own each time, as each run has (a .minisig made, not truncated).
                copy = os.path.join(tmp, f"run-{events}-{i}.jsonl")
                os.link(path, copy)
                fd = os.open(copy, os.O_WRONLY)
                t0 = time.perf_counter()
                sealer.seal(fd, copy, start, end, end["d"])
                seals.append((time.perf_counter() - t0) * 1000)
                os.close(fd)
                t0 = time.perf_counter()
                found = evidence.check(copy, key=evidence.public_key_for(None), ledger=ledger.read())
                checks.append((time.perf_counter() - t0) * 1000)
                assert found.exit_code == 0, found.layers
            rows.append((events, os.path.getsize(path), statistics.median(seals), statistics.median(checks)))
        del signing
    return rows


# CPU time (the process's own): under a loaded machine's waits, what loading costs.
LOAD = r"""
import ctypes, sys, time
import stages.record.events
t0 = time.process_time()
if sys.argv[1] == "libsodium":
    from stages.record import sodium
    sodium.library()
else:
    import cryptography.hazmat.primitives.asymmetric.ed25519
print((time.process_time() - t0) * 1000)
"""


def library_load(rounds: int) -> dict[str, float | None]:
    """Median CPU ms to load each signing library in a fresh interpreter that
    has imported ctypes and vpnw's record package already (as the recorder's
    fork has), interleaved."""
    took: dict[str, list[float]] = {"libsodium": [], "cryptography": []}
    for _ in range(rounds):
        for name in took:
            # From /: the installed vpnw, as a run loads it.
            r = subprocess.run([sys.executable, "-c", LOAD, name], cwd="/", capture_output=True, text=True)
            if r.returncode == 0:
                took[name].append(float(r.stdout))
    return {name: statistics.median(ms) if ms else None for name, ms in took.items()}


def no_way_out() -> None:
    """This process and all it starts in a new network namespace: no route."""
    import ctypes
    clone_newnet = 0x40000000
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(clone_newnet) != 0:
        raise SystemExit(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())} "
                         "(the benchmark needs root)")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    no_way_out()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for name, ms in library_load(rounds).items():
        print(f"load of {name} in a process with ctypes (median of {rounds}): "
              + (f"{ms:.2f} ms CPU" if ms is not None else "not installed"))
    print("\nthe recorder's end (seal) and show --verify's check, medians:")
    print(f"{'events':>8} {'file':>10} {'seal ms':>9} {'verify ms':>10}")
    for events, size, seal, check in seal_and_verify(max(5, rounds // 2)):
        print(f"{events:>8} {size / 1e6:>8.2f}MB {seal:>9.2f} {check:>10.2f}")
    s, share = startup(rounds)
    (uw, uc), (sw, sc) = s["unsigned"], s["signed"]
    print(f"\nvpnw run -- true, {rounds} interleaved rounds, medians: --record - (unsigned) "
          f"{uw:.1f} ms wall, {uc:.1f} ms CPU; signed {sw:.1f} ms wall, {sc:.1f} ms CPU; "
          f"difference {sw - uw:+.1f} ms wall, {sc - uc:+.1f} ms CPU (the record file's own "
          "costs included: protected, reserved, written)")
    if share:
        print(f"signing's share of a signed run (its recorder's marks, medians): at the end, "
              f"events ended -> signed {share['end_ms']:.2f} ms wall, {share['end_cpu']:.2f} ms CPU "
              f"(vpnw waits for it); at the start, key and ledger opened {share['open_ms']:.2f} ms "
              f"wall, {share['open_cpu']:.2f} ms CPU (in parallel with the helper's seal; the "
              f"recorder came last in {share['recorder_last']:.0%} of the runs)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
    main()

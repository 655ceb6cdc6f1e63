"""Benchmark: what the held layer costs (docs/security.md, "The work set and
the held layer").

1. Start-up: `true` alone; `vpnw run --record /dev/null -- true` started in a
   project directory (the layer on, as every run without [files]); the same
   with a policy whose `[files] allow_write = ["/"]` lifts the write limit
   (no layer; a [files] run also gets a minimal /dev); median wall time of
   interleaved rounds.
2. The layer's mounts alone (init's side, in a fresh user + mount namespace
   as the helper makes them): plan, overlays, binds back, read-only splits.
3. Writes through it: `pip install --user --no-index` of a few wheels
   (requests, urllib3, idna, certifi, charset_normalizer, rich, pygments,
   markupsafe, jinja2) with HOME outside the work set (held), HOME inside the
   work set (real writes), and without vpnw; median of rounds.

No network at all. Run as any user:
    /opt/vpnw-venv/bin/python scripts/bench_held.py [rounds] [pip-rounds]
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

VPNW = os.path.join(os.path.dirname(sys.executable), "vpnw")
WHEELS = "/opt/pypi/files"
PACKAGES = ["requests", "urllib3", "idna", "certifi", "charset_normalizer", "rich", "pygments",
            "markupsafe", "jinja2", "markdown-it-py", "mdurl"]


def timed(argv, env=None, cwd=None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


def rm(path: str) -> None:
    subprocess.run(["chmod", "-R", "u+rwX", path], capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


def start_up(rounds: int, top: str) -> None:
    project = os.path.join(top, "project")
    os.makedirs(project)
    lifted = os.path.join(top, "lifted.toml")
    with open(lifted, "w") as f:
        f.write('version = 1\n[policy]\ndefault = "allow"\n[files]\nallow_write = ["/"]\n')
    env = {**os.environ, "XDG_STATE_HOME": os.path.join(top, "state")}
    cases = {
        "true": ["true"],
        "vpnw run -- true (layer)": [VPNW, "run", "--record", "/dev/null", "--quiet", "--", "true"],
        "vpnw run, allow_write = [\"/\"] (no layer)":
            [VPNW, "run", "--record", "/dev/null", "--quiet", "--policy", lifted, "--", "true"],
    }
    times = {name: [] for name in cases}
    for _ in range(rounds):
        for name, argv in cases.items():
            times[name].append(timed(argv, env=env, cwd=project))
    base = statistics.median(times["true"])
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:45s} {m:7.1f} ms  (+{m - base:.1f} over true)")


def layer_alone(rounds: int, top: str) -> None:
    """held_layer.mount in a fresh user + mount namespace, as init calls it."""
    code = r'''
import os, sys, time
from stages.kernel import privileges as priv
from stages.helper import held_layer
held, work, hide, home = sys.argv[1:5]
uid, gid = os.getuid(), os.getgid()
priv.unshare(priv.CLONE_NEWUSER | priv.CLONE_NEWNS)
priv.write_id_maps(uid, gid)
priv.mount(None, "/", None, priv.MS_REC | priv.MS_PRIVATE)
held_fd = os.open(held, os.O_DIRECTORY)    # held/ is hidden once the layer is made
start = time.perf_counter()
held_layer.mount(held, (work, "/tmp"), hide, (home,))
took = (time.perf_counter() - start) * 1000
import json
with open("layers.json", opener=lambda name, flags: os.open(name, flags, dir_fd=held_fd)) as f:
    print(took, len(json.load(f)))
'''
    took, count = [], 0
    for i in range(rounds):
        held = os.path.join(top, "state", "vpnw", "held", f"bench-{i}")
        os.makedirs(held, mode=0o700)
        out = subprocess.run([sys.executable, "-c", code, held, os.path.join(top, "project"),
                              os.path.join(top, "state", "vpnw", "held"), os.path.expanduser("~")],
                             capture_output=True, text=True, check=True).stdout.split()
        took.append(float(out[0]))
        count = int(out[1])
        rm(held)
    print(f"  the layer's mounts alone: {statistics.median(took):.1f} ms for {count} overlays")


def pip_install(rounds: int, top: str) -> None:
    python = "/usr/bin/python3"
    work = os.path.join(top, "project")
    outside = tempfile.mkdtemp(prefix="vpnw-bench-held-home-", dir="/var/tmp")
    argv = [python, "-m", "pip", "install", "-q", "--user", "--break-system-packages", "--no-index",
            "--find-links", WHEELS, "--no-cache-dir", "--disable-pip-version-check", *PACKAGES]
    cases = {
        "without vpnw, HOME outside": (argv, outside),
        "vpnw, HOME inside the work set": ([VPNW, "run", "--record", "/dev/null", "--quiet", "--", *argv],
                                           os.path.join(work, "home")),
        "vpnw, HOME outside (held)": ([VPNW, "run", "--record", "/dev/null", "--quiet", "--", *argv],
                                      outside),
    }
    times = {name: [] for name in cases}
    try:
        for _ in range(rounds):
            for name, (cmd, home) in cases.items():
                for stale in (os.path.join(home, ".local"), os.path.join(home, ".cache")):
                    rm(stale)
                os.makedirs(home, exist_ok=True)
                state = os.path.join(top, "state")
                times[name].append(timed(cmd, env={**os.environ, "HOME": home, "XDG_STATE_HOME": state,
                                                    "PIP_CONFIG_FILE": "/dev/null"}, cwd=work))
                rm(os.path.join(state, "vpnw", "held"))
    finally:
        rm(outside)
    base = statistics.median(times["without vpnw, HOME outside"])
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:45s} {m:7.0f} ms  ({m / base:.2f}x)")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    pip_rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with open("/proc/loadavg") as f:
        print(f"load before: {f.read().split()[:3]}")
    top = tempfile.mkdtemp(prefix="vpnw-bench-held-", dir="/var/tmp")
    try:
        print(f"start-up, median of {rounds} interleaved rounds:")
        start_up(rounds, top)
        layer_alone(max(3, rounds // 2), top)
        print(f"pip install --user of {len(PACKAGES)} wheels, median of {pip_rounds} rounds:")
        pip_install(pip_rounds, top)
    finally:
        rm(top)
    with open("/proc/loadavg") as f:
        print(f"load after: {f.read().split()[:3]}")


if __name__ == "__main__":
    main()

"""Benchmark: what a policy's [files] table costs.

1. Start-up: `vpnw run --record /dev/null --policy P -- true`, wall time,
   median of interleaved rounds, for: no policy; a policy without [files];
   [files] with 10 entries; [files] with 100 entries (directories and files
   to hide, trees to keep writable; ~90% deny_read, ~10% allow_write).
2. The file-limit steps alone, which 1. measures through noise: the
   policy parsed and resolved (orchestrator side), and the mounts made
   (init's side, in a fresh user + mount namespace), median of rounds.
3. Per open(): a program opens and closes one file N times, for reading and
   for writing (O_WRONLY, in a writable tree), and times itself: outside
   vpnw, inside without [files], inside with the 100-entry table (mounts and,
   where the kernel has it, Landlock).

No network at all (the program makes no connection). Run as any user:
    /opt/vpnw-venv/bin/python scripts/bench_files.py [rounds] [opens]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

VPNW = os.path.join(os.path.dirname(sys.executable), "vpnw")

OPENER = r'''
import os, sys, time
path, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
flags = os.O_RDONLY if mode == "read" else os.O_WRONLY
start = time.perf_counter()
for _ in range(n):
    os.close(os.open(path, flags))
print((time.perf_counter() - start) / n * 1e9)
'''


def make_tree(top: str, entries: int) -> str:
    """A tree with `entries` paths for a [files] table; returns its policy text."""
    deny, write = [], []
    for i in range(entries):
        if i % 10 == 9:
            d = os.path.join(top, f"writable-{i}")
            os.makedirs(d, exist_ok=True)
            write.append(d)
        elif i % 3 == 0:
            f = os.path.join(top, f"secret-file-{i}")
            with open(f, "w") as fh:
                fh.write("secret")
            deny.append(f)
        else:
            d = os.path.join(top, f"secret-dir-{i}")
            os.makedirs(d, exist_ok=True)
            deny.append(d)
    write.append(os.path.join(top, "work"))
    os.makedirs(write[-1], exist_ok=True)
    quoted = lambda paths: "[" + ", ".join(f'"{p}"' for p in paths) + "]"  # noqa: E731
    return (f'version = 1\n[policy]\ndefault = "deny"\nallow = []\n[files]\n'
            f"deny_read = {quoted(deny)}\nallow_write = {quoted(write)}\n")


def steps(policy_file: str, cwd: str, rounds: int) -> tuple[float, float]:
    from stages.config.file_limits import resolve
    from stages.config.policy import load_policy
    parse, mount = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        policy = load_policy(policy_file)
        limits = resolve(policy.files, policy_file, home=os.path.expanduser("~"), cwd=cwd)
        parse.append(time.perf_counter() - t0)
        plan = limits.to_helper(landlock_abi=0)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                from stages.helper import file_mounts
                from stages.kernel import privileges as priv
                uid, gid = os.getuid(), os.getgid()
                priv.unshare(priv.CLONE_NEWUSER | priv.CLONE_NEWNS)
                priv.write_id_maps(uid, gid)
                priv.mount(None, "/", None, priv.MS_REC | priv.MS_PRIVATE)
                t0 = time.perf_counter()
                file_mounts.apply(plan)
                os.write(w, repr(time.perf_counter() - t0).encode())
            finally:
                os._exit(0)
        os.close(w)
        out = os.read(r, 100)
        os.close(r)
        os.waitpid(pid, 0)
        mount.append(float(out))
    return ((statistics.median(parse) * 1000, min(parse) * 1000),
            (statistics.median(mount) * 1000, min(mount) * 1000))


def wall(argv: list[str], cwd: str) -> float:
    start = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{argv} -> {r.returncode}\n{r.stderr}")
    return elapsed


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    opens = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    top = tempfile.mkdtemp(prefix="vpnw-bench-files-")
    os.chmod(top, 0o755)
    plain = os.path.join(top, "plain.toml")
    with open(plain, "w") as f:
        f.write('version = 1\n[policy]\ndefault = "deny"\nallow = []\n')
    policies = {}
    for n in (10, 100):
        tree = os.path.join(top, f"tree{n}")
        os.makedirs(tree)
        policies[n] = os.path.join(top, f"files{n}.toml")
        with open(policies[n], "w") as f:
            f.write(make_tree(tree, n))
    base = [VPNW, "run", "--record", "/dev/null"]
    setups = [("no policy", base + ["--", "true"]),
              ("policy, no [files]", base + ["--policy", plain, "--", "true"]),
              ("[files], 10 entries", base + ["--policy", policies[10], "--", "true"]),
              ("[files], 100 entries", base + ["--policy", policies[100], "--", "true"])]
    for _label, argv in setups:        # warm the page cache and the venv's imports
        wall(argv, top)
    times: dict[str, list[float]] = {label: [] for label, _ in setups}
    for _ in range(rounds):
        for label, argv in setups:     # interleaved, so drift hits every setup alike
            times[label].append(wall(argv, top))
    print(f"start-up, `vpnw run -- true`, wall ms over {rounds} rounds: median (min)")
    none = statistics.median(times["no policy"])
    for label, _ in setups:
        med = statistics.median(times[label])
        print(f"  {label:<22} {med * 1000:7.1f} ({min(times[label]) * 1000:6.1f})"
              f"   median {(med - none) * 1000:+6.1f} vs no policy")

    print(f"\nthe file-limit steps alone, ms over {rounds} rounds: median (min)")
    print("  (mount(2) takes the kernel's global namespace lock: other processes making")
    print("   namespaces or mounts, as a busy machine's do, stretch the median)")
    for n in (10, 100):
        parse, mount = steps(policies[n], top, rounds)
        print(f"  {n:>3} entries: parse+resolve {parse[0]:6.2f} ({parse[1]:5.2f})"
              f"   mounts in init {mount[0]:6.2f} ({mount[1]:5.2f})")

    opener = os.path.join(top, "opener.py")
    with open(opener, "w") as f:
        f.write(OPENER)
    work = os.path.join(top, "tree100", "work")
    target = os.path.join(work, "target")
    with open(target, "w") as f:
        f.write("x")
    py = sys.executable
    print(f"\nper open()+close(), {opens} times, ns over 7 runs: median (min)")
    for mode in ("read", "write"):
        prog = [py, opener, target, mode, str(opens)]
        where = [("outside", prog),
                 ("inside, no [files]", base + ["--policy", plain, "--", *prog]),
                 ("inside, 100 entries", base + ["--policy", policies[100], "--", *prog])]
        for label, argv in where:
            samples = []
            for _ in range(7):
                r = subprocess.run(argv, cwd=work, capture_output=True, text=True, check=True)
                samples.append(float(r.stdout.split()[-1]))
            print(f"  {mode:<5} {label:<22} {statistics.median(samples):7.0f} ({min(samples):6.0f})")
    subprocess.run(["rm", "-rf", top], check=False)


if __name__ == "__main__":
    main()

"""What the protected paths cost at start-up (issue 32), apart from the noise
of a whole `vpnw run -- true`:

    /opt/vpnw-venv/bin/python -I scripts/bench/protected_binds.py [ROUNDS]

- the orchestrator's share: stages/config/protected.py's protect() for this
  user's home, this interpreter's installation and the working directory;
- init's share: the read-only binds of that list, against the state
  directory alone (what was bound before), each in a fresh user + mount
  namespace, interleaved; medians.

Run it as each user of interest (root, and e.g. `su vpnwtest -c ...` from a
directory that user can read).
"""
from __future__ import annotations

import os
import sys
import time

import stages
from stages.config import protected as pr
from stages.config.file_limits import invoker_homes, locate
from stages.helper import out_of_reach
from stages.kernel import privileges as priv


def protection() -> pr.Protection:
    home, others = invoker_homes(dict(os.environ))
    cwd = os.getcwd()
    return pr.protect(pr.Inputs(
        homes=(home, *others), cwd=cwd,
        install=pr.installation(sys.executable, [p for p in sys.path if p != cwd], sys.prefix,
                                sys.base_prefix, os.path.dirname(stages.__file__), None),
        evidence=(state_dir(),)), locate, pr.read_small)


def state_dir() -> str:
    from stages.record.events import vpnw_state_dir
    return vpnw_state_dir()


def binds_ms(paths: list[str]) -> float:
    """init's _out_of_program_reach for `paths`, in a fresh user + mount namespace."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        uid, gid = os.getuid(), os.getgid()
        priv.unshare(priv.CLONE_NEWUSER | priv.CLONE_NEWNS)
        priv.write_id_maps(uid, gid)
        priv.mount(None, "/", None, priv.MS_REC | priv.MS_PRIVATE)
        t0 = time.perf_counter()
        problem = out_of_reach.out_of_program_reach(paths, [])
        os.write(w, f"{(time.perf_counter() - t0) * 1e3} {problem}".encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    ms, problem = out.split(" ", 1)
    if problem != "None":
        raise SystemExit(problem)
    return float(ms)


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    os.makedirs(state_dir(), exist_ok=True)
    computed = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        p = protection()
        computed.append((time.perf_counter() - t0) * 1e3)
    paths = p.to_helper()["read_only"]
    before, after = [], []
    for _ in range(rounds):
        before.append(binds_ms([state_dir()]))
        after.append(binds_ms(paths))
    print(f"protect(): {median(computed):.2f} ms ({len(paths)} read-only, {len(p.absent)} absent)")
    print(f"init's binds: {median(after):.2f} ms for {len(paths)} paths; "
          f"{median(before):.2f} ms for the state directory alone; "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()

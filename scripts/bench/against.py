"""Another revision of vpnw, built as a user would install it, for the bench
to run beside this one (`scripts/bench/run --against REV`).

REV's own tree (`git archive`, so a revision from before a layout change runs
from the modules it had) is installed non-editable into a venv of its own,
made from /usr/bin/python3 like scripts/setup's. A revision's build never
changes, so it is kept under /var/tmp/vpnw-bench-rev-<commit>/ and reused by
the next run against the same commit; `rm -rf /var/tmp/vpnw-bench-rev-*`
frees it (and the .lock beside each).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile

BUILDS = "/var/tmp"


def resolve(repo: str, rev: str) -> str:
    """REV -> its full commit id; SystemExit naming REV when git has none."""
    done = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"--against {rev}: no such commit in {repo}")
    return done.stdout.strip()


def build(repo: str, rev: str) -> str:
    """The vpnw executable of REV, built once; progress on stderr."""
    commit = resolve(repo, rev)
    home = os.path.join(BUILDS, f"vpnw-bench-rev-{commit}")
    with open(home + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)     # two benches at once build it once
        return _build(repo, rev, commit, home)


def _build(repo: str, rev: str, commit: str, home: str) -> str:
    vpnw = os.path.join(home, "venv", "bin", "vpnw")
    if os.path.exists(os.path.join(home, "ready")) and os.access(vpnw, os.X_OK):
        return vpnw
    shutil.rmtree(home, ignore_errors=True)
    os.makedirs(home)
    # A half-made build is never taken for a whole one: "ready" comes last.
    with tempfile.TemporaryDirectory(prefix="src-", dir=home) as src:
        archive = subprocess.Popen(["git", "-C", repo, "archive", commit], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", src], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"--against {rev}: git archive failed")
        print(f"bench: building {rev} ({commit[:12]}) into {home}/venv", file=sys.stderr, flush=True)
        subprocess.run(["/usr/bin/python3", "-m", "venv", os.path.join(home, "venv")], check=True)
        subprocess.run([os.path.join(home, "venv", "bin", "python"), "-m", "pip", "install", "-q", src],
                       check=True)
        # As scripts/setup does after installing, where the revision has it:
        # the seccomp filter's cache (stages/helper/seccomp_cache.py).
        subprocess.run([os.path.join(home, "venv", "bin", "python"), "-I", "-m",
                        "stages.helper.seccomp_cache"], cwd="/", stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    os.chmod(home, 0o755)
    subprocess.run(["chmod", "-R", "a+rX", home], check=True)
    with open(os.path.join(home, "ready"), "w") as f:
        f.write(commit + "\n")
    return vpnw

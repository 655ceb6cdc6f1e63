"""The supervisor answers a connect by what it read once, never by a second
read (docs/security.md, "Unix sockets by origin"; issue 46, 3).

A program connects again and again to an address in its memory that names
a socket of its own (a.sock, which it listens on under the filter) while
another of its threads rewrites one byte of it, so that it names a socket
bound outside (b.sock) and back (tests/progs/unix_race.py). Real seccomp,
the real kernel: the program is a plain forked child under vpnw's own
filter for the program, its listener handed over as the helper hands it
(tests/progs/race_supervisors.py).

- vpnw's supervisor, by the compiled path and by the Python path alone:
  b.sock is never reached; a.sock is (control: the allowed connect works),
  and some connects are refused and reported (control: the supervisor did
  read the rewritten address, so the race was on).
- The control that shows the test can fail: a deliberately naive supervisor
  on the same kernel plumbing reads the address, judges it by its path and
  answers SECCOMP_USER_NOTIF_FLAG_CONTINUE; the kernel then reads the address
  again, and the race takes the program to b.sock within NAIVE_TRIES tries.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ci_support import cannot

DRIVER = Path(__file__).resolve().parent / "progs" / "race_supervisors.py"
NAIVE_TRIES = 3000          # the naive supervisor must lose within these
VPNW_TRIES = 600            # each way of vpnw's (half blocking, half not)


@pytest.fixture
def race(tmp_path):
    """The race's directory, with b.sock bound and listened on here, outside
    any filter (a socket no supervisor may let the program reach); and how to
    run one supervisor over the program there, from outside the checkout (so
    the installed `stages`, with its compiled path, is the one imported)."""
    outside = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    outside.bind(str(tmp_path / "b.sock"))
    outside.listen(128)

    def run(way: str, tries: int, **env) -> dict:
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("PYTHONPATH", "VPNW_SUPERVISOR_PYTHON")}
        done = subprocess.run([sys.executable, str(DRIVER), way, str(tmp_path), str(tries)],
                              cwd=tmp_path, env={**clean, **env}, capture_output=True, text=True,
                              timeout=120)
        if "cannot run" in done.stderr or "libseccomp" in done.stderr:
            cannot(done.stderr.strip().splitlines()[-1])
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.splitlines()[-1])
        assert not result["stages"].startswith(str(Path(__file__).resolve().parent.parent))
        return result
    yield tmp_path, run
    outside.close()


def test_a_naive_check_then_continue_supervisor_is_beaten_by_the_race(race):
    directory, run = race
    result = run("naive", NAIVE_TRIES)
    counts = result["counts"]
    print(f"\nthe naive supervisor: beaten at try {counts['tries']} of {NAIVE_TRIES}: {counts}")
    assert counts["b"] >= 1, counts


@pytest.mark.parametrize("way", ["compiled", "python"])
def test_the_supervisor_never_lets_the_rewritten_address_through(race, way):
    directory, run = race
    result = run("vpnw", VPNW_TRIES, **({"VPNW_SUPERVISOR_PYTHON": "1"} if way == "python" else {}))
    if way == "compiled" and not result["answered_by"].startswith("compiled"):
        cannot(f"the compiled path is not there: {result['answered_by']}")
    counts, refusals = result["counts"], result["refusals"]
    print(f"\nvpnw's supervisor ({result['answered_by']}): {counts}; "
          f"{len(refusals)} refusals reported")
    assert counts["b"] == 0, counts
    assert counts["a"] > 0, counts                              # control: a.sock is reached
    assert counts["refused"] > 0, counts                        # control: the race was on
    assert len(refusals) == counts["refused"]
    assert set(refusals) == {str(directory / "b.sock")}

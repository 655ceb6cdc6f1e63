"""`vpnw watch` (issue 44): the live view of a run going on in another
terminal, in a real terminal (tmux), as root and as vpnwtest. A traced
program reaches one destination, is refused another (the machine's cloud
metadata address: refused with no policy at all), then waits for the test's
word; the view shows both rows while the run goes on, then the run's end."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tmux_support import wait_file

pytestmark = pytest.mark.world


def test_the_live_view_follows_a_traced_run_in_another_terminal(world, user, term):
    work = term.work
    record, go_on = work / "run.jsonl", work / "go-on"
    script = ("curl -s -o /dev/null http://api.github.com/whoami; "
              "curl -s -o /dev/null http://169.254.169.254/latest/meta-data/; "
              f"while [ ! -e {go_on} ]; do sleep 0.1; done")
    run = world.popen([str(world.vpnw_path), "trace", "--record", str(record), "--", "sh", "-c", script],
                      user=user, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_file(record, lambda text: text.count('"policy.deny"') >= 1)
        mark = term.start(f"{term.vpnw} watch {record}")
        term.wait_for(r"running")
        row_ok = term.wait_for(r"^api\.github\.com:80 +1 +0 +0 +0 .*allowed$", whole=True)
        row_denied = term.wait_for(r"^169\.254\.169\.254:80 +0 +1 +0 +0 .* denied: 169\.254", whole=True)
        # The newest refusal in full, the DENY line's words, under the table.
        last = term.wait_for(r"^last: 169\.254\.169\.254:80 denied: 169\.254\.169\.254:80: the cloud "
                             r"metadata service's address", whole=True)
        assert row_ok and row_denied and last
        term.wait_for(r"1 allowed, 1 denied, 0 failed; 2 destinations")
        # The run ends in its own terminal: the view shows it, and stops.
        go_on.touch()
        assert run.wait(timeout=60) == 120, run.stderr.read()
        term.wait_for(r"ended, exit 120")
        assert term.finished(mark) == 0
    finally:
        go_on.touch()
        if run.poll() is None:
            run.kill()
            run.wait()

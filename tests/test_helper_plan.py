"""The plan vpnw sends the helper it forked first (stages/wire/helper_plan.py):
every field comes back as sent, a pipe that ends before a whole plan is no
plan (the helper then makes nothing), and reading it loads no JSON module."""
from __future__ import annotations

import marshal
import os
import subprocess
import sys
import threading

from stages.config.file_limits import MountPlan
from stages.config.protected import HelperProtection
from stages.wire import helper_plan

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PLAN = helper_plan.Plan(
    env={"PATH": "/usr/bin", "HTTPS_PROXY": "http://127.0.0.1:8080", "NAME": "é ✓ \x01"},
    files=MountPlan(hide=(("/home/u/.ssh", "dir"),), limit_writes=True,
                    writable=(("/tmp", "dir"), ("/home/u/w", "dir")), landlock_abi=3),
    protected=HelperProtection(read_only=("/home/u/.bashrc",), hide=(("/home/u/.vpnw", "dir"),)),
    capture=True, local_ports=(5432, 8080), unix_allow=(("$SSH_AUTH_SOCK", "/tmp/agent.sock"),))


def _through_a_pipe(data: bytes) -> helper_plan.Plan | None:
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, data), os.close(w)))
    writer.start()
    try:
        return helper_plan.receive(r)
    finally:
        writer.join()
        os.close(r)


def test_a_plan_comes_back_as_sent():
    got = _through_a_pipe(helper_plan.encode(PLAN))
    assert got.env == PLAN.env
    assert tuple(got.files) == (PLAN.files.hide, True, PLAN.files.writable, 3)
    assert (got.files.hide, got.files.writable, got.files.landlock_abi) == \
        (PLAN.files.hide, PLAN.files.writable, 3)
    assert tuple(got.protected) == tuple(PLAN.protected)
    assert (got.capture, got.local_ports, got.unix_allow) == (True, (5432, 8080), PLAN.unix_allow)


def test_an_empty_plan_is_the_defaults():
    assert _through_a_pipe(helper_plan.encode(helper_plan.Plan())) == helper_plan.Plan()


def test_a_plan_cut_short_or_never_sent_is_none():
    whole = helper_plan.encode(PLAN)
    assert _through_a_pipe(b"") is None                       # vpnw refused the run or died
    for cut in (1, 3, 4, len(whole) // 2, len(whole) - 1):
        assert _through_a_pipe(whole[:cut]) is None, cut
    assert _through_a_pipe(whole + b"x") is None
    assert _through_a_pipe(whole) is not None                 # control


def test_a_plan_of_another_version_is_none():
    body = helper_plan.encode(PLAN)[4:]
    other = marshal.dumps((helper_plan.VERSION + 1, *marshal.loads(body)[1:]))
    assert _through_a_pipe(len(other).to_bytes(4, "big") + other) is None


def test_reading_a_plan_loads_no_json_module():
    code = ("import sys\nfrom stages.wire import helper_plan\n"
            "helper_plan.decode(helper_plan.encode(helper_plan.Plan(env={'A': 'b'})))\n"
            "print(' '.join(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT}).stdout.split()
    assert "stages.wire.helper_plan" in out                   # control
    assert not {"json", "orjson", "pickle"} & set(out)

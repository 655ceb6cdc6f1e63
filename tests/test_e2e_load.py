"""Load: 10,000 connections in sequence and 1,000 open at once, through both
doors, leave the broker with no more descriptors and no more than a bounded
amount of memory than before. The program and the test take turns over a
pipe: the program does a phase, says so, and waits while the test measures
the broker through /proc.

The figures are printed (pytest -s shows them); the only assertions are
bounded slack, never speed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from e2e_support import wait_until
from progs_support import prog_text
from stages.record.events import read_events
from stages.record import check
from stages.record.check import check_run, schema_problems
from stages.broker.workers import MAX_WORKERS
from test_e2e_faults import Running, children, stages_of  # noqa: F401

pytestmark = [pytest.mark.world, pytest.mark.slow]

SEQUENCE = 10_000
AT_ONCE = 1_000
BURST = 64          # the warm-up's burst: 64 connections held at once
FD_SLACK = 8
RSS_SLACK_KIB = 64 * 1024

LOAD_AGENT = prog_text("load_agent.py")


def broker_figures(pid: int) -> tuple[int, int]:
    """Open descriptors and RSS of the broker and its workers together
    (broker/workers.py: one process per core, each accepting on the doors)."""
    fds = rss = 0
    for each in (pid, *children(pid)):
        fds += len(os.listdir(f"/proc/{each}/fd"))
        rss += next(int(line.split()[1]) for line in open(f"/proc/{each}/status")
                    if line.startswith("VmRSS:"))
    return fds, rss


def test_no_descriptor_or_memory_leak_after_10000_in_sequence_and_1000_at_once(world, user, monkeypatch):
    agent = world.file("load_agent.py", LOAD_AGENT)
    # The workers the broker would fork at its first load (one per core, at
    # most MAX_WORKERS), started with the loop instead (VPNW_BROKER_WORKERS),
    # so that they are all in the figure before: forked at load, they came
    # only if the lead saw LOAD_PER_TICK connections within one tick, which a
    # loaded machine's clients did not reach (a fresh-clone run at load: "not
    # within 20 s: the broker's workers"). The fork at load is
    # test_broker_workers.py's.
    workers = max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))
    proc = world.popen([str(world.vpnw_path), "run", "--", sys.executable, str(agent)], user=user,
                       env={"VPNW_BROKER_WORKERS": str(workers)},
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(stages_of(proc.pid)) == 3, what="vpnw's three stages")
        broker = stages_of(proc.pid)["broker"]

        def step(command: str, expect: str) -> str:
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            assert line.startswith(expect), (line, proc.poll())
            return line

        def settled() -> tuple[int, int]:
            # Closes finish asynchronously: wait until the broker's descriptors stop falling.
            last = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                now = broker_figures(broker)
                if last is not None and now[0] == last[0]:
                    return now
                last = now
                time.sleep(0.5)
            return last

        assert step("warm 200", "warm done").strip() == "warm done failed=0"
        proc.stdin.write("\n")
        proc.stdin.flush()
        # Then a burst, so that every worker has served before the figure.
        assert step(f"once {BURST}", "once held").strip() == f"once held {BURST}"
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "once done failed=0"
        proc.stdin.write("\n")
        proc.stdin.flush()
        wait_until(lambda: len(children(broker)) >= workers - 1, what="the broker's workers")
        before = settled()

        assert step(f"seq {SEQUENCE}", "seq done").strip() == "seq done failed=0"
        proc.stdin.write("\n")
        proc.stdin.flush()
        after_sequence = settled()

        assert step(f"once {AT_ONCE}", "once held").strip() == f"once held {AT_ONCE}"
        peak = broker_figures(broker)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "once done failed=0"
        proc.stdin.write("\n")
        proc.stdin.flush()
        after_once = settled()

        proc.stdin.write("quit\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    figures = {"user": user, "before": before, "after_10000_in_sequence": after_sequence,
               "peak_1000_at_once": peak, "after_1000_at_once": after_once,
               "unit": "(open fds, RSS KiB)"}
    print("broker load figures:", json.dumps(figures))
    assert proc.returncode == 0, err
    assert peak[0] >= before[0] + AT_ONCE, "the 1,000 were not open at once"
    for label, (fds, rss) in (("after the sequence", after_sequence), ("after the 1,000", after_once)):
        assert fds <= before[0] + FD_SLACK, f"{label}: broker fds {before[0]} -> {fds}"
        assert rss <= before[1] + RSS_SLACK_KIB, f"{label}: broker RSS {before[1]} -> {rss} KiB"
    files = sorted((proc.state_home / "vpnw" / "runs").glob("*.jsonl"), key=os.path.getmtime)
    with open(files[-1], "rb") as f:
        events = list(read_events(f, strict=True))
    # check_run's invariants over every event; its JSON Schema pass costs
    # minutes over ~50,000 events, so the schema is checked on every event
    # outside the connections and on one connection event in 50.
    with monkeypatch.context() as m:
        m.setattr(check, "_validator", lambda: None)
        assert not check_run(events), check_run(events)[:5]
    sample = [e for i, e in enumerate(events) if e["conn"] is None or i % 50 == 0]
    assert not [p for e in sample for p in schema_problems(e)]
    total = 200 + BURST + SEQUENCE + AT_ONCE
    assert sum(1 for e in events if e["type"] == "conn.close") == total
    assert events[-1]["fields"]["connections"] == total


BURST_AGENT = prog_text("burst_agent.py")


def test_broker_workers_share_the_doors_and_number_connections_once(world, user):
    # Two broker processes (broker/workers.py) accept on the same doors: a
    # burst from 16 threads through both is served by both, and the record
    # still numbers the connections 1..N, each once, each accounted, with
    # the totals of both in run.end.
    from e2e_support import assert_every_connection_accounted, describe, run_events
    agent = world.file(f"burst_agent_{user}.py", BURST_AGENT)
    per_thread, threads = 25, 16
    r = world.vpnw(["run", "--", sys.executable, str(agent), str(per_thread), str(threads)],
                   user=user, env={"VPNW_BROKER_WORKERS": "2"}, timeout=300)
    assert r.returncode == 0, describe(r)
    events = run_events(r)
    by_conn = assert_every_connection_accounted(events)
    total = per_thread * threads
    assert sorted(by_conn) == list(range(1, total + 1))
    assert events[-1]["fields"]["connections"] == total
    assert {e["fields"]["kind"] for e in events if e["type"] == "conn.request"} == {"http-forward", "socks5"}
    # Each event names the process that wrote it: both brokers served.
    served_by = {e["pid"] for e in events if e["conn"] is not None}
    assert len(served_by) == 2, served_by


FLOOD_AGENT = prog_text("flood_agent.py")


def test_broker_workers_wait_for_load(world, user):
    # With no count set, the workers are forked only once the lead sees
    # load (workers.LOAD_PER_TICK connections within one LOAD_TICK): a run of
    # a few connections is served by one process; a flood wakes the others,
    # which then take their share of what follows.
    from e2e_support import assert_every_connection_accounted, describe, run_events
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: the broker has no workers")
    agent = world.file(f"flood_agent_{user}.py", FLOOD_AGENT)
    few = world.vpnw(["run", "--", sys.executable, str(agent), "2", "2"], user=user, timeout=120)
    assert few.returncode == 0, describe(few)
    events = run_events(few)
    assert len({e["pid"] for e in events if e["conn"] is not None}) == 1
    assert events[-1]["fields"]["connections"] == 4
    flood = world.vpnw(["run", "--", sys.executable, str(agent), "200", "400"], user=user, timeout=300)
    assert flood.returncode == 0, describe(flood)
    events = run_events(flood)
    assert sorted(assert_every_connection_accounted(events)) == list(range(1, 601))
    assert len({e["pid"] for e in events if e["conn"] is not None}) >= 2


# Fills the SOCKS door's backlog with whole requests (greeting, CONNECT and a
# GET at once, no answer read) and exits at once: at the end of the run the
# broker finds them all waiting.
LEAVE_AGENT = prog_text("leave_agent.py")


def test_a_backlog_full_of_requests_left_at_exit_is_all_recorded(world, user):
    # The program may leave as many requests as the door's backlog holds and
    # exit: each is taken at the end, reaches the record and ends there, and
    # the run ends (within the broker's grace, not by the test's timeout).
    from e2e_support import assert_every_connection_accounted, describe, run_events
    agent = world.file(f"leave_agent_{user}.py", LEAVE_AGENT)
    r = world.vpnw(["run", "--", sys.executable, str(agent), "300"], user=user, timeout=120)
    assert r.returncode == 0, describe(r)
    events = run_events(r)
    assert sorted(assert_every_connection_accounted(events)) == list(range(1, 301))
    requests = [e for e in events if e["type"] == "conn.request"]
    assert len(requests) == 300 and {e["fields"]["host"] for e in requests} == {"api.github.com"}
    assert events[-1]["fields"]["connections"] == 300

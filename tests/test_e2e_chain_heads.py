"""The chain's head off the machine (issue 30): with --syslog, the recorder
sends the head at run.start, at checkpoints, at run.end and once the run is
signed, into a real rsyslogd (Debian's) in the test world; docs/record.md's
query, run as written there, finds a run file rewritten afterwards, even
with its chain recomputed and signed again with the user's own key (which
the signature alone cannot show). As root and as vpnwtest.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from e2e_support import describe
from progs_support import prog_text
from rsyslog_support import Rsyslog
from stages.record.chain import Chain, unchained

pytestmark = pytest.mark.world

HERE = Path(__file__).resolve().parent
PYTHON = "/usr/bin/python3"
CONNECTIONS = 60      # some 300 lines: at least one checkpoint every 256


def the_query() -> str:
    """docs/record.md's check against the collector, as written there."""
    doc = (HERE.parent / "docs" / "record.md").read_text()
    section = doc[doc.index("## The chain's head off the machine"):]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def run_query(world, user, run_id: str, path: Path, collected: Path, work: Path):
    env = {"RUN": run_id, "FILE": str(path), "COLLECTED": str(collected)}
    return world.run(["bash", "-euc", the_query()], user=user, env=env, cwd=work)


@pytest.fixture
def collector(world, request):
    rs = Rsyslog(world, f"heads-{os.getpid()}-{request.node.name[-30:]}".replace("[", "-").replace("]", ""),
                 udp_port=None, tcp_port=None)
    rs.start()
    yield rs
    rs.stop()


def test_a_rewritten_run_disagrees_with_the_collector(world, user, collector):
    state, work = world.state_home(user), world.workdir(user)
    agent = world.file("socks_agent.py", (HERE / "progs" / "socks_agent.py").read_bytes())
    r = world.vpnw(["run", "--syslog", str(collector.socket), "--", PYTHON, str(agent),
                    json.dumps([["api.github.com", 80, CONNECTIONS]])], user=user, state_home=state)
    assert r.returncode == 0, describe(r)
    [path] = (state / "vpnw" / "runs").glob("*.jsonl")
    lines = path.read_bytes().splitlines()
    events = [json.loads(line) for line in lines]
    run_id = events[0]["run"]
    assert events[-1]["fields"]["syslog_lost"] == 0
    heads = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        heads = [h for h in collector.heads() if h["run"] == run_id]
        if any(h["at"] == "sealed" for h in heads):
            break
        time.sleep(0.1)
    # Where the heads were taken, and that each is the file's digest at that line.
    assert [h["at"] for h in heads][0] == "run.start" and [h["at"] for h in heads][-2:] == ["run.end", "sealed"]
    assert "checkpoint" in [h["at"] for h in heads], heads
    for h in heads:
        assert events[h["line"] - 1]["d"] == h["d"], h
    sealed = heads[-1]
    ledger = [json.loads(x) for x in (state / "vpnw" / "ledger.jsonl").read_bytes().splitlines()]
    assert (sealed["line"], sealed["ledger"], sealed["ledger_d"]) == (len(lines), 1, ledger[-1]["d"])
    assert sealed["key"] == ledger[-1]["key"]

    collected = collector.parsed_file
    ok = run_query(world, user, run_id, path, collected, work)
    assert ok.returncode == 0 and ok.stdout == "", describe(ok)

    # The same user rewrites a line in the middle, recomputes the chain and
    # signs the file again with their own key: vpnw show --verify has
    # nothing left to object to on the machine; the collector does.
    middle = next(i for i in range(len(lines) // 2, len(lines)) if b'"api.github.com"' in lines[i])
    forged = list(lines)
    forged[middle] = forged[middle].replace(b"api.github.com", b"api.gitxub.com")
    chain = Chain()
    data = b"".join(chain.seal(unchained(line)) + b"\n" for line in forged)
    with open(path, "r+b") as out:
        out.write(data)
        out.truncate()
    resign = world.run([str(world.vpnw_path.parent / "python"), "-c", RESIGN, str(path)], user=user,
                       state_home=state)
    assert resign.returncode == 0, describe(resign)
    bad = run_query(world, user, run_id, path, collected, work)
    assert bad.returncode == 1, describe(bad)
    first_after = min(h["line"] for h in heads if h["line"] > middle)   # line middle+1 changed
    said = bad.stdout.splitlines()
    assert said[0].startswith(f"line {first_after}: the file has "), bad.stdout
    assert f", the collector {events[first_after - 1]['d']}" in said[0]

    # Cut to before the last checkpoint: the collector's later heads are past its end.
    last_cp = max(h["line"] for h in heads if h["at"] == "checkpoint")
    with open(path, "r+b") as out:
        out.truncate(sum(len(x) + 1 for x in lines[:last_cp - 1]))
    cut = run_query(world, user, run_id, path, collected, work)
    assert cut.returncode == 1 and f"line {last_cp}: the file ends before it" in cut.stdout, describe(cut)


# What the same user can do with their own key: sign the rewritten file again
# and fix its ledger entry (the vpnw code they have), as an attacker would.
RESIGN = prog_text("resign.py")

"""vpnw relays bytes exactly: many downloads and uploads of random sizes
through each door, each checked by sha256 and length (through the HTTP door's
forwarder with Content-Length and chunked bodies, which the broker splices
when long; on kept-alive connections, each request decided anew and counted
exactly in the record); the first connection a
program makes the instant it starts succeeds; vpnw passes exit codes on."""
from __future__ import annotations

import json
import math
import random
import sys

import pytest

from ci_support import cannot
from e2e_support import assert_every_connection_accounted, closes, describe, run_events
from progs_support import prog_text
from world import payload_sha256

pytestmark = pytest.mark.world

MAX_SIZE = 64 << 20
OPS_PER_DOOR = 200
# The sizes that catch off-by-one and buffer-boundary bugs come first.
EDGE_SIZES = [0, 1, 2, 4095, 4096, 4097, 65535, 65536, 65537, (1 << 20) + 1, MAX_SIZE]
DOORS = ["http-forward", "http-connect", "socks"]
HOSTS = ["api.github.com", "files.pythonhosted.org", "pypi.world", "git.world"]
# Sizes and their sums: a fixed seed, so every run moves the same bytes.
_sha_cache: dict[tuple[int, str], str] = {}


def expected_sha(size: int, seed: str) -> str:
    if (size, seed) not in _sha_cache:
        _sha_cache[(size, seed)] = payload_sha256(size, seed)
    return _sha_cache[(size, seed)]


def make_plan(door: str) -> list[dict]:
    rng = random.Random(f"relay-plan-{door}")
    # The forwarder frames bodies itself: chunked ones too, both ways.
    ops = ["get", "put", "getc", "putc"] if door == "http-forward" else ["get", "put"]
    opposite = {"get": "put", "put": "get", "getc": "putc", "putc": "getc"}
    sizes = list(EDGE_SIZES)
    while len(sizes) < OPS_PER_DOOR:
        # Log-uniform on [1, 64 MiB]: most transfers are small, a few are large.
        sizes.append(int(math.exp(rng.uniform(0, math.log(MAX_SIZE + 1)))) - 1)
    plan = []
    for i, size in enumerate(sizes):
        plan.append({"op": ops[i % len(ops)], "host": HOSTS[i % len(HOSTS)],
                     "size": size, "seed": f"{door}-{i}"})
    # Each size both ways: edge sizes are downloaded and uploaded.
    for op in plan[: len(EDGE_SIZES)]:
        plan.append({**op, "op": opposite[op["op"]], "seed": op["seed"] + "-b"})
    return plan


@pytest.mark.timeout(900)   # the transfers are allowed 600 s
@pytest.mark.parametrize("door", DOORS)
def test_relay_is_byte_exact(world, user, door):
    plan = make_plan(door)
    client = world.program("relay_client.py")
    plan_text = "".join(json.dumps(op) + "\n" for op in plan)
    r = world.vpnw(["run", "--", sys.executable, str(client), door, str(world.ca_pem), "4"],
                   user=user, input=plan_text, timeout=600)
    assert r.returncode == 0, describe(r)
    results = [json.loads(line) for line in r.stdout.splitlines()]
    assert [res["i"] for res in results] == list(range(len(plan)))
    wrong = []
    for op, res in zip(plan, results):
        want = {"length": op["size"], "sha256": expected_sha(op["size"], op["seed"])}
        got = {k: res.get(k) for k in ("length", "sha256")}
        if "error" in res or got != want:
            wrong.append((op, res))
    assert not wrong, f"{len(wrong)} of {len(plan)} transfers wrong, e.g. {wrong[:3]}"
    events = run_events(r)
    by_conn = assert_every_connection_accounted(events)
    assert len(by_conn) == len(plan)
    # The record's byte counts cover at least the payloads moved each way.
    counted = closes(events)
    assert len(counted) == len(plan)
    assert sum(c["bytes_down"] for c in counted) >= sum(op["size"] for op in plan if op["op"] in ("get", "getc"))
    assert sum(c["bytes_up"] for c in counted) >= sum(op["size"] for op in plan if op["op"] in ("put", "putc"))


# What a step adds to the record beyond its body: heads (< 1 KiB each way)
# and, for chunked bodies, chunk-size lines (the world's cuts: >= 1 per 200 KiB).
HEAD_SLACK = 1024


def framing_slack(step: dict) -> int:
    return HEAD_SLACK + (64 * (step["size"] // (200 * 1024) + 8) if step["op"] in ("getc", "putc") else 0)


@pytest.mark.timeout(900)   # the transfers are allowed 600 s
def test_kept_alive_http_door_bodies_are_exact_and_each_request_is_decided(world, user):
    # One client connection: large and small bodies, Content-Length and
    # chunked, both ways (the broker splices the long ones), then a request
    # to a host the policy denies: it still gets its 403 on the same
    # connection, and the record counts every body byte once.
    policy = world.file(f"relay-policy-{user}.toml",
                        'version = 1\nname = "relay"\n[policy]\ndefault = "deny"\n'
                        'allow = ["api.github.com:80"]\n')
    steps = [{"op": op, "host": "api.github.com", "size": size, "seed": f"kept-{user}-{n}"}
             for n, (op, size) in enumerate([("get", MAX_SIZE), ("put", MAX_SIZE), ("getc", 5 << 20),
                                             ("putc", (3 << 20) + 1), ("get", 0), ("put", 65537),
                                             ("getc", 0), ("putc", 1), ("get", 100000)])]
    steps.append({"op": "get", "host": "pypi.world", "size": 1, "seed": "denied"})
    client = world.program("relay_client.py")
    plan_text = json.dumps({"op": "seq", "host": "api.github.com", "steps": steps}) + "\n"
    r = world.vpnw(["guard", "--policy", str(policy), "--", sys.executable, str(client), "http-forward",
                    str(world.ca_pem), "1"], user=user, input=plan_text, timeout=600)
    assert r.returncode == 120, describe(r)     # guard: a connection was denied
    results = json.loads(r.stdout)["steps"]
    want = [{"length": s["size"], "sha256": expected_sha(s["size"], s["seed"])} for s in steps[:-1]]
    assert results[:-1] == want
    assert results[-1]["status"] == 403 and "pypi.world:80" in results[-1]["deny"], results[-1]
    events = run_events(r)
    by_conn = assert_every_connection_accounted(events)
    assert [evs[0]["fields"]["host"] for _, evs in sorted(by_conn.items())] == ["api.github.com", "pypi.world"]
    counted, = closes(events)
    down = sum(s["size"] for s in steps[:-1] if s["op"] in ("get", "getc"))
    up = sum(s["size"] for s in steps[:-1] if s["op"] in ("put", "putc"))
    slack = sum(framing_slack(s) for s in steps[:-1])
    assert down <= counted["bytes_down"] <= down + slack, (counted, down)
    assert up <= counted["bytes_up"] <= up + slack, (counted, up)


FIRST_CONNECTION_RUNS = 20


def test_first_connection_at_start_succeeds(world, user):
    # curl starts in a few milliseconds and connects at once: the doors must
    # already be listening when the program starts, every time.
    failures = []
    for n in range(FIRST_CONNECTION_RUNS):
        r = world.vpnw(["run", "--", "curl", "-sS", "--max-time", "30", "-o", "/dev/null",
                        "-w", "%{http_code}", "http://api.github.com/whoami"], user=user)
        if r.returncode != 0 or r.stdout != "200":
            failures.append((n, describe(r)))
    assert not failures, f"{len(failures)} of {FIRST_CONNECTION_RUNS} runs failed; first: {failures[0]}"


@pytest.mark.parametrize("program, code", [
    (["true"], 0),
    (["false"], 1),
    (["sh", "-c", "exit 42"], 42),
    (["/nonexistent/vpnw-no-such-program"], 127),
    (["vpnw-no-such-program-on-path"], 127),
    (["sh", "-c", "kill -9 $$"], 137),
    (["sh", "-c", "kill -TERM $$"], 143),
])
def test_exit_codes_pass_through(world, user, program, code):
    r = world.vpnw(["run", "--", *program], user=user)
    assert r.returncode == code, describe(r)
    end = run_events(r)[-1]
    assert end["type"] == "run.end" and end["fields"]["exit_code"] == code


# Inside the sandbox: the namespace's TCP default, the program's own socket to
# the SOCKS5 door and, through sock_diag (`ss`), both ends of that connection
# (the door's end is the broker's accepted socket, in this namespace too).
LOOPBACK_TCP_PROBE = prog_text("loopback_tcp_probe.py")


def test_sandbox_loopback_runs_without_pacing(world, user):
    """Every TCP socket of the sandbox takes reno, not the machine's default
    (BBR here, whose pacing made each tunnel through a door about a quarter
    slower: docs/architecture.md, "Tunnel throughput: the bound"); outside,
    the machine's own default is left as it is."""
    outside = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    # Control: what a new network namespace takes without vpnw (the machine's
    # default, which new namespaces inherit) is not reno already, or the
    # checks below could not tell vpnw's setting from it.
    fresh = world.run(["unshare", "-Urn", "cat", "/proc/sys/net/ipv4/tcp_congestion_control"], user=user)
    assert fresh.returncode == 0, describe(fresh)
    if fresh.stdout.strip() == "reno":
        cannot("this machine's TCP default is reno: nothing here could tell vpnw's reno from it")
    probe = world.file("loopback_tcp_probe.py", LOOPBACK_TCP_PROBE)
    r = world.vpnw(["run", "--", sys.executable, str(probe)], user=user)
    assert r.returncode == 0, describe(r)
    said = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert said["default"] == "reno"
    assert said["program"] == "reno"
    assert said["ends"].split() == ["reno", "reno"], said
    assert open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip() == outside

"""The doors as a way out: what a CONNECT or SOCKS5 request for the broker
machine's own services, cloud metadata and private addresses reaches.

With no policy (`vpnw run`), 127.0.0.1 at a door means the broker machine's
loopback, never the sandbox's own, and vpnw never dials it (issue 44: the
machine itself is out of reach unless a rule names it; the world's listener
there is the control; tests/bypass/test_the_machine.py has every way). Under a
policy with `deny_private = true` every such destination is refused, through
both doors (403 / reply 0x02), with a policy.deny event that names the rule
and the address. The control: the same destination, dialled from the world
directly, reaches a listener the test put there.
"""
from __future__ import annotations

import ipaddress

import pytest

from bypass_bench import BROKER_V4, BROKER_V6, TARGET_TCP

pytestmark = pytest.mark.world

DOORS = ["http", "socks"]
REFUSAL = {"http": "HTTP_403", "socks": "SOCKS_0x02"}

# (host, port, text the denial's reason must hold)
PRIVATE_TARGETS = [
    ("127.0.0.1", TARGET_TCP, "127.0.0.1"),
    ("0.0.0.0", TARGET_TCP, "0.0.0.0"),
    ("::", TARGET_TCP, "::"),
    ("::ffff:127.0.0.1", TARGET_TCP, "127.0.0.1"),
    ("169.254.169.254", 80, "169.254.169.254"),
    ("168.63.129.16", 80, "168.63.129.16"),
    ("100.100.100.200", 80, "100.100.100.200"),
    ("fd00:ec2::254", 80, "fd00:ec2::254"),
    (BROKER_V4, TARGET_TCP, BROKER_V4),
    (BROKER_V6, TARGET_TCP, BROKER_V6),
    ("localhost", TARGET_TCP, "localhost: a name for this machine's own loopback (RFC 6761"),  # by name
    ("metadata.world", 80, "169.254.169.254"),
]
POLICY = 'version = 1\nname = "deny-private"\n\n[policy]\ndeny_private = true\n'


def _tid(host, door):
    return f"{door}-{host}"


OPEN_PLAN = [{"id": f"own-loopback-{door}", "attempt": "own_loopback_via_door",
              "args": [door, TARGET_TCP], "control": "world"} for door in DOORS]
OPEN_CONTROL = [{"id": f"own-loopback-{door}", "attempt": "tcp_banner",
                 "args": ["127.0.0.1", TARGET_TCP], "control": "world"} for door in DOORS]
DENY_PLAN = ([{"id": _tid(host, door), "attempt": "door", "args": [door, host, port]}
              for host, port, _ in PRIVATE_TARGETS for door in DOORS]
             # Another port, so each request in the record is the only one for its host:port.
             + [{"id": f"own-loopback-{door}", "attempt": "own_loopback_via_door",
                 "args": [door, TARGET_TCP + 1]} for door in DOORS])
DENY_CONTROL = [{"id": host, "attempt": "tcp", "args": [host, port], "control": "world"}
                for host, port, _ in PRIVATE_TARGETS]
UNIX_PLAN = [{"id": "abstract", "attempt": "unix_connect", "args": ["@{abstract}"], "control": "world"},
             {"id": "path", "attempt": "unix_connect", "args": ["{unix_path}"], "control": "world"}]


def _same_host(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a.lower() == b.lower()


def _events_of(events, door, host, port):
    """Every event of the one connection that asked `door` for host:port."""
    conns = [e["conn"] for e in events if e["type"] == "conn.request"
             and e["fields"]["door"] == door and e["fields"]["port"] == port
             and _same_host(e["fields"]["host"], host)]
    assert len(conns) == 1, (door, host, port, [e for e in events if e["type"] == "conn.request"])
    return [e for e in events if e["conn"] == conns[0]]


def _guard(bench, user):
    policy = bench.world.file("deny-private.toml", POLICY)
    return bench.inside("doors-deny", user, DENY_PLAN, vpnw_args=("guard", "--policy", str(policy)),
                        expect_exit=120)


@pytest.mark.parametrize("door", DOORS)
def test_no_policy_door_to_loopback_is_refused(bench, user, door):
    """Issue 44: with no policy the door's 127.0.0.1 is the broker machine's
    loopback, which vpnw never dials (decide.py step 4): refused, the
    record naming rule "machine" and the door rule that would open it. The
    control: the world's listener there answers the same user outside."""
    results, events = bench.inside("doors-open", user, OPEN_PLAN, expect_exit=120)
    res = results[f"own-loopback-{door}"]
    assert not res["ok"] and res["errno"] == REFUSAL[door], res
    conn = _events_of(events, door, "127.0.0.1", TARGET_TCP)
    denial = [e["fields"] for e in conn if e["type"] == "policy.deny"]
    assert len(denial) == 1 and denial[0]["rule"] == "machine", conn
    assert f'"localhost:{TARGET_TCP}"' in denial[0]["reason"], denial
    assert not [e for e in conn if e["type"] == "conn.open"], conn
    control = bench.control("doors-open", user, OPEN_CONTROL, "world")[f"own-loopback-{door}"]
    assert control["ok"] and control["detail"] == "world", control


@pytest.mark.parametrize("door", DOORS)
def test_deny_private_door_to_own_loopback_is_refused(bench, user, door):
    results, events = _guard(bench, user)
    res = results[f"own-loopback-{door}"]
    assert not res["ok"] and res["errno"] == REFUSAL[door], res


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("host,port,named", PRIVATE_TARGETS, ids=[t[0] for t in PRIVATE_TARGETS])
def test_deny_private_refuses_through_the_door(bench, user, door, host, port, named):
    results, events = _guard(bench, user)
    res = results[_tid(host, door)]
    assert not res["ok"], f"a way out: {door} door reached {host}:{port} under deny_private: {res}"
    assert res["errno"] == REFUSAL[door], res
    conn = _events_of(events, door, host, port)
    denials = [e["fields"] for e in conn if e["type"] == "policy.deny"]
    assert len(denials) == 1 and denials[0]["rule"] == "deny_private" and denials[0]["enforced"], conn
    named = (named,) if isinstance(named, str) else named
    assert any(n in denials[0]["reason"] for n in named), denials[0]
    assert not [e for e in conn if e["type"] == "conn.open"], conn
    control = bench.control("doors-deny", user, DENY_CONTROL, "world")[host]
    assert control["ok"], f"control outside: {host}:{port} must be reachable from the world: {control}"


def test_abstract_socket_outside_is_out_of_reach_even_with_unix_sockets_allowed(bench, user):
    """Abstract Unix names belong to a network namespace: lifting the Unix
    rule does not make the world's names reachable."""
    results, _ = bench.inside("unix-allowed", user, UNIX_PLAN, vpnw_args=("run", "--allow-unix-sockets"))
    assert not results["abstract"]["ok"] and results["abstract"]["errno"] == "ECONNREFUSED", results
    control = bench.control("unix-allowed", user, UNIX_PLAN, "world")
    assert control["abstract"]["ok"] and control["abstract"]["detail"] == "world", control


def test_path_socket_is_reachable_with_unix_sockets_allowed(bench, user):
    """What --allow-unix-sockets is for (and why it is recorded): a socket by
    path is a file, and files are shared with the sandbox."""
    results, events = bench.inside("unix-allowed", user, UNIX_PLAN, vpnw_args=("run", "--allow-unix-sockets"))
    assert results["path"]["ok"] and results["path"]["detail"] == "world", results
    start = next(e for e in events if e["type"] == "run.start")
    assert start["fields"]["allow_unix_sockets"] is True

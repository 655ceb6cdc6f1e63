"""Issue 44: the machine itself is out of reach unless a rule names it
(docs/architecture.md "The machine itself"), with no policy at all and under
a policy that leaves deny_private off: its loopback, its own addresses, the
link-local range and the cloud metadata addresses, by literal and by a name
that resolves there, through both doors and through capture (whose DNS
door's made-up address stands for the name).

Each attempt accepts only the door's refusal (403, SOCKS5 reply 0x02) or,
captured, the reset; anything else fails, success included. The record
names rule "machine" and the rule to add. The control: the same destination
dialled from the world as the same user reaches the listener the bench put
there (test_doors.DENY_CONTROL).
"""
from __future__ import annotations

import pytest

from bypass_bench import BROKER_V4, TARGET_TCP
from test_doors import DENY_CONTROL, DOORS, PRIVATE_TARGETS, REFUSAL, _events_of, _tid

pytestmark = pytest.mark.world

OPEN_POLICY = 'version = 1\nname = "open"\n\n[policy]\ndefault = "allow"\ndeny_private = false\n'
RUNS = {
    "no-policy": ("run",),
    "deny_private-false": ("guard", "--policy", "{policy}"),
}
PLAN = [{"id": _tid(host, door), "attempt": "door", "args": [door, host, port]}
        for host, port, _ in PRIVATE_TARGETS for door in DOORS]
# Captured: the program ignores the proxy settings and connects itself.
# (host, port, attempt, the refusal it must meet): a plain HTTP request gets
# vpnw's 403, a TLS handshake the alert access_denied.
CAPTURED = [("169.254.169.254", 80, "tcp_ask", "HTTP_403_VPNW"),
            (BROKER_V4, TARGET_TCP, "tcp_ask", "HTTP_403_VPNW"),
            ("metadata.world", 80, "tcp_ask", "HTTP_403_VPNW"),
            ("fd00:ec2::254", 80, "tcp_ask", "HTTP_403_VPNW"),
            ("metadata.world", 443, "tls_handshake", "TLS_ALERT_ACCESS_DENIED"),
            ("169.254.169.254", 443, "tls_handshake", "TLS_ALERT_ACCESS_DENIED")]
CAPTURE_PLAN = [{"id": f"captured-{host}-{port}", "attempt": attempt, "args": [host, port],
                 "control": "world"} for host, port, attempt, _ in CAPTURED]


def _args(bench, how: str) -> tuple:
    policy = bench.world.file("the-machine-open.toml", OPEN_POLICY)
    return tuple(a.format(policy=policy) for a in RUNS[how])


def _the_rule_to_add(host: str, port: int, reason: str) -> None:
    loopback = host in ("127.0.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1", "localhost")
    assert (f'"localhost:{port}"' if loopback else f":{port}\"") in reason, reason
    assert "never dials" in reason, reason


@pytest.mark.parametrize("how", list(RUNS))
@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("host,port,named", PRIVATE_TARGETS, ids=[t[0] for t in PRIVATE_TARGETS])
def test_the_machine_is_out_of_reach_through_the_doors(bench, user, how, door, host, port, named):
    results, events = bench.inside(f"the-machine-{how}", user, PLAN, vpnw_args=_args(bench, how),
                                   expect_exit=120)
    res = results[_tid(host, door)]
    assert not res["ok"], f"a way out: {door} door reached {host}:{port} ({how}): {res}"
    assert res["errno"] == REFUSAL[door], res
    conn = _events_of(events, door, host, port)
    denials = [e["fields"] for e in conn if e["type"] == "policy.deny"]
    assert len(denials) == 1 and denials[0]["rule"] == "machine" and denials[0]["enforced"], conn
    named = (named,) if isinstance(named, str) else named
    assert any(n in denials[0]["reason"] for n in named), denials[0]
    _the_rule_to_add(host, port, denials[0]["reason"])
    assert not [e for e in conn if e["type"] == "conn.open"], conn
    control = bench.control("doors-deny", user, DENY_CONTROL, "world")[host]
    assert control["ok"], f"control outside: {host}:{port} must be reachable from the world: {control}"


@pytest.mark.parametrize("how", list(RUNS))
@pytest.mark.parametrize("host,port,attempt,refusal", CAPTURED, ids=[f"{h}-{p}" for h, p, _, _ in CAPTURED])
def test_the_machine_is_out_of_reach_through_capture(bench, user, how, host, port, attempt, refusal):
    results, events = bench.inside(f"the-machine-capture-{how}", user, CAPTURE_PLAN,
                                   vpnw_args=(*_args(bench, how), "--capture"), expect_exit=120)
    res = results[f"captured-{host}-{port}"]
    assert not res["ok"] and res["errno"] == refusal, \
        f"a way out: a captured connection reached {host}:{port} ({how}): {res}"
    denials = [e for e in events if e["type"] == "policy.deny" and e["fields"]["port"] == port
               and e["fields"]["door"] == "capture"
               and e["fields"]["host"] in (host, host.lower())]
    assert len(denials) == 1 and denials[0]["fields"]["rule"] == "machine", denials
    reason = denials[0]["fields"]["reason"]
    _the_rule_to_add(host, port, reason)
    if refusal == "HTTP_403_VPNW":       # the program reads the DENY line's words
        assert f"denied: {reason}" in res["detail"], res
    assert not [e for e in events if e["type"] == "conn.open" and e["conn"] == denials[0]["conn"]]
    control = bench.control("the-machine-capture", user, CAPTURE_PLAN, "world")[f"captured-{host}-{port}"]
    assert control["ok"], f"control outside: {host}:{port} must be reachable from the world: {control}"

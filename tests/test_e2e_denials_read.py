"""Issue 44: every door's refusal, read by real clients. One `vpnw guard
--capture` run per user: each client asks for evil.example (no allow rule
names it) through the doors it takes by itself (the proxy variables), and
again with the proxy variables unset, so that capture takes its connection;
dig asks the DNS door (and a Go program its own way). What each client prints must hold the DENY line's
words or, for TLS through capture, the alert access denied, never a reset
or "not known". The control: the same clients reach api.github.com, which
the policy allows, in the same run."""
from __future__ import annotations

import json
import shutil
import sys

import pytest

from ci_support import node_with_env_proxy
from e2e_support import describe, run_events
from progs_support import prog_text
from test_e2e_guard import policy_file

pytestmark = pytest.mark.world

DRIVER = prog_text("denials_driver.py")

REASON = "evil.example:{port} denied: no allow rule matches evil.example:{port}; default is deny"


def test_every_door_s_refusal_reads_the_same_in_the_clients_own_words(world, user):
    if shutil.which("dig") is None:
        pytest.skip("needs dig (scripts/setup installs bind9-dnsutils)")
    policy = policy_file(world, 'default = "deny"\nallow = ["api.github.com"]\n')
    driver = world.file("denials_driver.py", DRIVER)
    node = shutil.which("node") or node_with_env_proxy() or ""
    r = world.vpnw(["guard", "--capture", "--policy", policy, "--", "/usr/bin/python3", str(driver),
                    sys.executable, node], user=user, timeout=300)
    assert r.returncode == 120, describe(r)
    said = {a["id"]: a for a in map(json.loads, r.stdout.splitlines())}
    http, tls = REASON.format(port=80), REASON.format(port=443)
    # The HTTP door: the body (plain requests), the status line (CONNECT).
    assert f"vpnw: {http}" in said["curl-http"]["out"], said["curl-http"]
    assert f"< HTTP/1.1 403 vpnw: {tls}" in said["curl-https"]["out"], said["curl-https"]
    assert f"403 vpnw: {tls}" in said["requests"]["out"], said["requests"]
    assert f"vpnw: {tls}" in said["httpx"]["out"] or "403" in said["httpx"]["out"], said["httpx"]
    assert f"HTTP/1.1 403 vpnw: {tls}" in said["git"]["out"], said["git"]["out"][-3000:]
    assert f"403 vpnw: {tls}" in said["pip"]["out"], said["pip"]
    if node:
        assert "alert access denied" in said["captured-node-fetch"]["out"], said["captured-node-fetch"]
    # The DNS door: the reason as an Extended DNS Error (dig asks with EDNS).
    dig = said["dig"]["out"]
    assert "status: NOERROR" in dig and "EDE: 15 (Blocked)" in dig, dig
    assert "vpnw: evil.example denied: no allow rule matches evil.example; default is deny" in dig, dig
    # Capture: TLS gets the alert, plain HTTP the 403 with the words.
    assert "alert access denied" in said["captured-curl-https"]["out"], said["captured-curl-https"]
    assert f"vpnw: {http}" in said["captured-curl-http"]["out"], said["captured-curl-http"]
    assert "ALERT_ACCESS_DENIED" in said["captured-requests"]["out"], said["captured-requests"]
    for client in said.values():
        assert "reset by peer" not in client["out"] and "not known" not in client["out"], client
    # The control: an allowed name in the same run.
    assert said["control-curl"]["out"] == "200", said["control-curl"]
    denials = [e["fields"] for e in run_events(r) if e["type"] == "policy.deny"]
    assert {d["door"] for d in denials} >= {"http", "capture"}, denials

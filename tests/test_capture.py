"""Capture's pure parts (stages/helper/capture.py, netlink's routes, the
capture door's original destination) and, in a scratch user+net namespace of
the test's own, the real kernel: the routes and the table install, read back
exactly, and anything added next to them is a seal problem."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ci_support import cannot
from progs_support import prog_text
from stages.broker.capture_door import NoOriginalDestination, parse_original_destination
from stages.config.policy import PolicyError, parse_policy
from stages.helper import capture, netlink
from stages.helper.supervisor.judge import loopback_port

REPO = Path(__file__).resolve().parent.parent


def listing(items: list[dict]) -> dict:
    handled = [{k: {**v, "handle": n} for k, v in item.items()} for n, item in enumerate(items)]
    return {"nftables": [{"metainfo": {"version": "1.0.6"}}, *handled]}


def test_exact_ruleset_passes_with_handles_and_metainfo():
    assert capture.ruleset_problems(listing(capture.expected_ruleset(1081, 53)), 1081, 53) == []


def test_another_table_a_missing_rule_or_another_port_is_a_problem():
    expected = capture.expected_ruleset(1081, 53)
    other = {"table": {"family": "ip", "name": "intruder"}}
    assert capture.ruleset_problems(listing(expected + [other]), 1081, 53) == [
        "unexpected nftables table ip intruder"]
    problems = capture.ruleset_problems(listing(expected[:-1]), 1081, 53)
    assert len(problems) == 1 and problems[0].startswith("missing nftables rule inet vpnw seal")
    assert capture.ruleset_problems(listing(expected), 1082, 53)
    assert capture.ruleset_problems(listing(expected), 1081, 5353)
    assert capture.ruleset_problems(listing(expected[::-1]), 1081, 53) == [
        "the nftables rules are not in the expected order"]
    assert capture.ruleset_problems(None, 1081, 53) == [
        "the nftables ruleset could not be read back as JSON"]


def test_seal_problems_with_and_without_capture_routes():
    lo = netlink.Interface(1, "lo", 0x9)
    loopback = netlink.Route(socket.AF_INET, bytes([127, 0, 0, 0]), 8, 255, netlink.RTN_LOCAL, 1)
    v4 = netlink.Route(socket.AF_INET, None, 0, 255, netlink.RTN_LOCAL, 1)
    v6 = netlink.Route(socket.AF_INET6, None, 0, 255, netlink.RTN_LOCAL, 1)
    assert netlink.seal_problems([lo], [loopback]) == []
    assert netlink.seal_problems([lo], [loopback, v4, v6], capture=True) == []
    # Without capture, the same routes are a wider network: refused.
    assert len(netlink.seal_problems([lo], [loopback, v4, v6])) == 2
    # With capture, a missing one, a second one, or a unicast default are refused.
    assert netlink.seal_problems([lo], [v4], capture=True) == [
        "the IPv6 local default route capture needs is missing"]
    assert netlink.seal_problems([lo], [v4, v6, v4], capture=True) == ["default route default/0 (table 255)"]
    unicast = netlink.Route(socket.AF_INET, None, 0, 254, netlink.RTN_UNICAST, 1)
    assert netlink.seal_problems([lo], [v4, v6, unicast], capture=True) == [
        "default route default/0 (table 254)"]


def test_local_default_request_is_what_the_route_dump_parses_back():
    request = netlink.local_default_request(socket.AF_INET6, 1, 7)
    length, kind, flags, seq, _pid = netlink._NLMSGHDR.unpack_from(request)
    assert (length, kind, seq) == (len(request), netlink.RTM_NEWROUTE, 7)
    assert flags & netlink.NLM_F_CREATE and flags & netlink.NLM_F_EXCL
    route = netlink.parse_route(request[netlink._NLMSGHDR.size:])
    assert netlink.is_capture_route(route) and route.oif == 1


def test_original_destination_parsing():
    v4 = bytes([2, 0, 0x01, 0xBB, 140, 82, 112, 6]) + bytes(8)
    assert parse_original_destination(socket.AF_INET, v4) == (
        __import__("ipaddress").ip_address("140.82.112.6"), 443)
    v6 = bytes([10, 0, 0, 22]) + bytes(4) + socket.inet_pton(socket.AF_INET6, "2001:db8::1") + bytes(4)
    assert str(parse_original_destination(socket.AF_INET6, v6)[0]) == "2001:db8::1"
    for family, raw in ((socket.AF_INET, b"\0" * 3), (socket.AF_UNIX, v4)):
        with pytest.raises(NoOriginalDestination):
            parse_original_destination(family, raw)


def test_policy_capture_key():
    assert parse_policy('version = 1\n[policy]\ncapture = true\n').capture is True
    assert parse_policy('version = 1\n[policy]\ndefault = "deny"\n').capture is False
    with pytest.raises(PolicyError, match='capture = true'):
        parse_policy('version = 1\n[policy]\ncapture = "yes"\n')


SCRATCH = prog_text("capture_scratch.py")


def _in_scratch_namespaces(flags: str, script: str) -> dict:
    """`script` (this checkout's Python) in namespaces of its own (unshare
    `flags`): its JSON answer; skipped where user namespaces cannot be made."""
    r = subprocess.run(["unshare", flags, sys.executable, "-c", script], capture_output=True,
                       text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if r.returncode and "unshare failed" in r.stderr:
        cannot(f"no user namespaces here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_install_in_a_scratch_namespace_reads_back_exactly():
    if shutil.which("unshare") is None:
        cannot("needs unshare (util-linux)")
    try:
        capture.Nftables().free()
    except capture.CaptureError as e:
        cannot(f"{e} (scripts/setup installs nftables, and with it libnftables)")
    got = _in_scratch_namespaces("-Urn", SCRATCH)
    assert got == {"before": [], "after": ["unexpected nftables table ip intruder"]}


RESOLV_SCRATCH = prog_text("resolv_scratch.py")


def test_resolv_conf_is_the_shipped_file_bound_read_only_with_no_mount_made_per_run():
    """One bind of the file vpnw ships (no tmpfs made and unmounted per run,
    whose RCU grace period stalled the seal); a source that is not a regular
    file is refused."""
    if shutil.which("unshare") is None or not os.path.isfile(os.path.realpath("/etc/resolv.conf")):
        cannot("needs unshare (util-linux) and an /etc/resolv.conf")
    got = _in_scratch_namespaces("-Urm", RESOLV_SCRATCH)
    assert got["text"] == (REPO / "stages/helper/resolv.conf").read_text()
    assert "nameserver 127.0.0.1\n" in got["text"]
    assert got["root"].endswith("/stages/helper/resolv.conf"), got
    assert got["options"].split(",")[0] == "ro"
    assert got["refused"] == 22


def test_doctor_says_whether_capture_works_here():
    from stages.orchestrator.doctor import check_capture
    try:
        capture.Nftables().free()
    except capture.CaptureError:
        assert check_capture().status == "warn"
        return
    check = check_capture()
    assert check.status == "ok", check


def test_without_libnftables_capture_fails_closed_with_the_reason():
    script = ("from stages.helper import capture\ncapture.LIBRARY = 'libnftables-missing.so.9'\n"
              "try:\n    capture.Nftables()\nexcept capture.CaptureError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "capture needs nftables' library libnftables-missing.so.9" in r.stdout, r


def test_localhost_ports_are_exact_localhost_rules_only():
    from stages.config.policy import localhost_ports, localhost_rule
    policy = parse_policy('version = 1\n[policy]\nallow = ["localhost:11434", "localhost:8080", '
                          '"api.github.com:443", "127.0.0.1:9000", "localhost"]\n'
                          'deny = ["localhost:8080"]\n')
    assert localhost_ports(policy) == (8080, 11434)
    assert localhost_rule(policy, 11434).text == "localhost:11434"
    assert localhost_rule(policy, 8080) is None       # the deny rule takes it back
    assert localhost_rule(policy, 9000) is None


def test_learn_drafts_capture_and_exact_localhost_rules():
    from stages.config.policy import localhost_ports
    from stages.learner.draft import draft_policy
    from stages.record.events import encode, read_events
    golden = REPO / "tests" / "golden" / "capture_trace.jsonl"
    events = list(read_events(open(golden, "rb"), strict=True))
    local = [json.loads(encode("r-c4f7e1", t, f, path="direct", conn=9, pid=1, ts_ns=1))
             for t, f in (("conn.request", {"door": "local", "kind": "local", "host": "localhost",
                                            "port": 80}),
                          ("policy.allow", {"rule": "allow", "reason": "x"}),
                          ("conn.open", {"address": "127.0.0.1", "port": 80, "via": "localhost",
                                         "ms": 0}),
                          ("conn.close", {"bytes_up": 1, "bytes_down": 2, "ms": 1}))]
    draft = draft_policy(events[:-2] + local + events[-2:])
    policy = parse_policy(draft)
    assert policy.capture is True
    assert localhost_ports(policy) == (80,)
    assert "git.world:22" in [r.text for r in policy.allow]


def test_loopback_port_reads_only_127_0_0_1_and_1():
    import struct as _struct
    v4 = lambda a, p: _struct.pack("<H", socket.AF_INET) + _struct.pack(">H", p) + bytes(a) + bytes(8)
    v6 = lambda a, p: (_struct.pack("<H", socket.AF_INET6) + _struct.pack(">H", p) + bytes(4)
                       + socket.inet_pton(socket.AF_INET6, a) + bytes(4))
    assert loopback_port(v4([127, 0, 0, 1], 11434)) == 11434
    assert loopback_port(v6("::1", 8080)) == 8080
    assert loopback_port(v6("::ffff:127.0.0.1", 5432)) == 5432
    for raw in (v4([127, 0, 0, 2], 80), v4([10, 0, 0, 1], 80), v6("::2", 80), b"", b"\x02\x00",
                v4([127, 0, 0, 1], 80)[:7]):
        assert loopback_port(raw) is None


def test_inet_diag_sees_loopback_and_wildcard_listeners_only(tmp_path):
    """In a scratch network namespace: 127.0.0.1, ::1, 0.0.0.0 and :: reach
    from loopback; 127.0.0.2 and a closed port do not."""
    if shutil.which("unshare") is None:
        cannot("needs unshare (util-linux)")
    script = prog_text("inet_diag_scratch.py")
    r = subprocess.run(["unshare", "-Urn", sys.executable, "-c", script], capture_output=True, text=True,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if r.returncode and "unshare failed" in r.stderr:
        cannot(f"no user namespaces here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"18001": True, "18002": True, "18003": True, "18004": True,
                                    "18005": False, "18006": False}


# --- what a refused captured connection is answered with (issue 44) ----------------

def test_a_refused_captured_connection_is_answered_in_its_own_protocol():
    import ssl as _ssl

    from stages.broker.capture_door import refusal_answer
    from stages.broker.connector import Denied
    from stages.protocols.tls_hello import ACCESS_DENIED_ALERT

    denied = Denied("no allow rule matches evil.example:443; default is deny (set in the policy)",
                    "default", None, "evil.example", 443)
    context = _ssl.create_default_context()
    incoming, outgoing = _ssl.MemoryBIO(), _ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="evil.example")
    try:
        tls.do_handshake()
    except _ssl.SSLWantReadError:
        pass
    hello = outgoing.read()
    assert refusal_answer(hello[:3], denied) is None            # more bytes, please
    assert refusal_answer(hello, denied) == ACCESS_DENIED_ALERT
    request = b"GET /x HTTP/1.1\r\nHost: evil.example\r\n\r\n"
    assert refusal_answer(request[:20], denied) is None
    answer = refusal_answer(request, denied)
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 403 vpnw: evil.example:443 denied: no allow rule matches "
                           b"evil.example:443; default is deny (set in the policy)\r\n")
    assert b"\r\nProxy-Status: vpnw;" in head
    assert body == (b"vpnw: evil.example:443 denied: no allow rule matches evil.example:443; "
                    b"default is deny (set in the policy)\n")
    assert refusal_answer(b"SSH-2.0-OpenSSH_9.2\r\n", denied) == b""   # another protocol: the reset
    assert refusal_answer(b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00", denied) == b""


def test_a_long_request_line_and_one_cut_short_are_still_http():
    from stages.broker.capture_door import refusal_answer
    from stages.broker.connector import Denied
    denied = Denied("why", "default", None, "203.0.113.66", 80)
    line = b"GET /whoami?" + b"x" * 200 + b" HTTP/1.0\r\nHost: evil.example\r\n\r\n"
    assert refusal_answer(line, denied).startswith(b"HTTP/1.1 403 vpnw: 203.0.113.66:80 denied: why\r\n")
    for cut in (1, 3, 4, 5):
        assert refusal_answer(line[:cut], denied) is None, cut
    assert refusal_answer(b"get / HTTP/1.0\r\n\r\n", denied) == b""      # not a method: the reset

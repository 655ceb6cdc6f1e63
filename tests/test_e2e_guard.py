"""Issue 3 through the real thing: `vpnw guard` (and run/trace --policy) in the
test world, with the real sandbox, broker and DNS server, as root and as an
unprivileged user.

A raw client inside the sandbox (GUARD_PROBE) speaks each door byte by byte,
so the tests see exactly what a program sees: the 403 and its X-Vpnw-Deny
header, the SOCKS5 reply code, the first response of a kept-alive connection.
The world's DNS log shows which names vpnw looked up; its web log, which
requests reached a server.
"""
from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest

from e2e_support import assert_every_connection_accounted, connections, describe, run_events
from progs_support import prog_text
from stages.record.check import check_run

pytestmark = pytest.mark.world

GUARD_PROBE = prog_text("guard_probe.py")

HUMAN_TIME = r"\d\d:\d\d:\d\d\.\d{3}"
METADATA_REASON = ("169.254.169.254: link-local address (169.254.0.0/16), where cloud "
                   "metadata services live")


# --- helpers ------------------------------------------------------------------------

def policy_file(world, body: str) -> str:
    """A policy file every user can read; the [policy] table starts on line 4."""
    text = f'version = 1\nname = "agent"\n[policy]\n{body}'
    return str(world.file(f"policy-{uuid.uuid4().hex[:10]}.toml", text))


def probe(world, plan: list[dict]) -> tuple[str, str]:
    program = world.file("guard_probe.py", GUARD_PROBE)
    plan_file = world.file(f"plan-{uuid.uuid4().hex[:10]}.json", json.dumps(plan))
    return str(program), str(plan_file)


def guarded(world, user, policy: str, plan: list[dict], *, mode: str = "guard",
            extra: tuple = (), program_exit: int = 0):
    """Run the probe under `vpnw <mode> --policy`; (result, one answer per op, events)."""
    program, plan_file = probe(world, plan)
    r = world.vpnw([mode, "--policy", policy, *extra, "--", sys.executable, program, plan_file,
                    str(program_exit)], user=user, timeout=120)
    answers = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(answers) == len(plan), describe(r)
    assert not [a for a in answers if "error" in a], describe(r)
    events = run_events(r)
    problems = check_run(events)
    assert problems == [], problems
    return r, answers, events


def requests_by_conn(events) -> dict[int, list[dict]]:
    return assert_every_connection_accounted(events)


def conn_of(events, host: str, port: int, kind: str | None = None) -> list[list[dict]]:
    """Every connection's events for host:port (and door kind), in order."""
    out = []
    for _, evs in sorted(requests_by_conn(events).items()):
        req = evs[0]["fields"]
        if req["host"] == host and req["port"] == port and (kind is None or req["kind"] == kind):
            out.append(evs)
    return out


def only(events_of_conn: list[dict], type_: str) -> dict:
    found = [e for e in events_of_conn if e["type"] == type_]
    assert len(found) == 1, (type_, events_of_conn)
    return found[0]


# A deny_private refusal names the setting after its reason (and the allow
# rule it overrides, if one matches): checked, then cut off to compare the reason.
NAMES_THE_SETTING = re.compile(r"; refused by deny_private = true \(set in [^)]*\)(, which comes before "
                               r"allow rule .*: set deny_private = false to allow it)?$")


def without_the_setting(reason: str, rule: str = "deny_private") -> str:
    named = NAMES_THE_SETTING.search(reason)
    assert (named is not None) == (rule == "deny_private"), reason
    return reason[:named.start()] if named else reason


def denial(evs: list[dict]) -> dict:
    """The denial's fields but its destination, which must be the request's
    (a decision names its destination itself: docs/record.md); a deny_private
    reason without the setting it names."""
    assert not any(e["type"] == "conn.open" for e in evs), evs
    fields = dict(only(evs, "policy.deny")["fields"])
    asked = only(evs, "conn.request")["fields"]
    assert {k: fields.pop(k) for k in ("host", "port", "door")} == \
        {k: asked[k] for k in ("host", "port", "door")}, evs
    fields["reason"] = without_the_setting(fields["reason"], fields["rule"])
    return fields


def assert_http_denied(answer: dict, reason: str) -> None:
    """The HTTP door's own terms: 403, the reason in the body and in X-Vpnw-Deny."""
    assert answer["status"] == 403, answer
    said = answer["headers"]["x-vpnw-deny"]
    assert reason in (said, NAMES_THE_SETTING.sub("", said)), answer
    # The body is the DENY line's words: `vpnw: HOST:PORT denied: REASON`.
    assert re.fullmatch(r"vpnw: \S+ denied: " + re.escape(said) + "\n", answer["body"]), answer
    assert answer["headers"]["proxy-status"].startswith("vpnw; error="), answer
    assert answer["headers"]["connection"].lower() == "close", answer


def assert_socks_denied(answer: dict) -> None:
    """The SOCKS door's own terms: reply 0x02 (not allowed by ruleset), then close."""
    assert answer["version"] == 5 and answer["reply"] == 0x02, answer
    assert answer["after"] == "", answer


def three_doors(host: str, port_tls: int = 443, port_plain: int = 80, get: str | None = None) -> list[dict]:
    """The same destination through HTTP CONNECT, an absolute-URI GET and SOCKS5 with a name."""
    return [{"op": "connect", "host": host, "port": port_tls},
            {"op": "get", "url": f"http://{host}:{port_plain}{get or '/whoami'}"},
            {"op": "socks", "host": host, "atyp": "domain", "port": port_tls}]


def lookups(world, mark: int, name: str) -> Counter:
    """Queries for `name` at the world's DNS server since `mark`, by type."""
    return Counter(qtype for qtype, qname, _ in world.dns_query_log(since=mark) if qname == name)


def one_lookup_each(n: int) -> Counter:
    # A look-up is one getaddrinfo: an A and an AAAA query.
    return Counter({"A": n, "AAAA": n}) if n else Counter()


def whoami(answer: dict) -> dict:
    inner = answer.get("inner", answer)
    assert inner["status"] == 200, answer
    return json.loads(inner["body"])


# --- the DNS log: what is denied is never looked up -------------------------------------

DEFAULT_DENY = ('default = "deny"\n'                               # line 4
                "deny_private = true\n"                            # line 5
                'allow = ["api.github.com", "files.pythonhosted.org"]\n'   # line 6
                'deny = ["*.example"]\n')                          # line 7


@pytest.mark.parametrize("deny_private", [True, False], ids=["deny_private", "names-only"])
def test_denied_names_are_never_looked_up_and_allowed_ones_once_per_connection(world, user, deny_private):
    body = DEFAULT_DENY if deny_private else DEFAULT_DENY.replace("deny_private = true", "deny_private = false")
    policy = policy_file(world, body)
    plan = (three_doors("evil.example")           # a deny rule
            + three_doors("pypi.world")           # no allow rule, default deny (the name exists)
            + [{"op": "connect", "host": "api.github.com", "port": 443},
               {"op": "get", "url": "http://api.github.com/whoami"},
               {"op": "socks", "host": "api.github.com", "atyp": "domain", "port": 80, "get": "/whoami"}])
    mark = world.dns_mark()
    r, answers, events = guarded(world, user, policy, plan)
    assert r.returncode == 120, describe(r)

    # Never asked: not the denied name, not the name no rule allows.
    asked = world.dns_queries(since=mark)
    assert "evil.example" not in asked and "pypi.world" not in asked, asked
    refused = conn_of(events, "evil.example", 443) + conn_of(events, "evil.example", 80) \
        + conn_of(events, "pypi.world", 443) + conn_of(events, "pypi.world", 80)
    assert len(refused) == 6, refused     # each door's try at each, none missing from the record
    for evs in refused:
        assert not any(e["type"] == "dns.resolve" for e in evs), evs

    deny_rule = 'evil.example:{port} matches deny rule "*.example" (%s line 7)' % policy
    default = "no allow rule matches pypi.world:{port}; default is deny (set in the policy)"
    for i, (template, host) in enumerate([(deny_rule, "evil.example"), (default, "pypi.world")]):
        connect, get, socks = answers[3 * i: 3 * i + 3]
        assert_http_denied(connect, template.format(port=443))
        assert_http_denied(get, template.format(port=80))
        assert_socks_denied(socks)
        kinds = [evs[0]["fields"]["kind"] for evs in conn_of(events, host, 443) + conn_of(events, host, 80)]
        assert sorted(kinds) == ["http-connect", "http-forward", "socks5"]

    # Allowed: looked up exactly once per connection, to decide (deny_private)
    # or only to dial (a name rule decides alone), and dialled at what was found.
    github = conn_of(events, "api.github.com", 443) + conn_of(events, "api.github.com", 80)
    assert len(github) == 3
    for evs in github:
        resolved = only(evs, "dns.resolve")["fields"]
        assert resolved["addresses"] == ["140.82.112.6"], resolved
        opened = only(evs, "conn.open")["fields"]
        assert opened["address"] in resolved["addresses"]
        types = [e["type"] for e in evs]
        # Looked up before the decision is written either way: to decide
        # (deny_private), or to be dialled, whose addresses step 4 (the
        # machine itself, issue 44) judges first.
        assert types.index("dns.resolve") < types.index("policy.allow"), types
    assert lookups(world, mark, "api.github.com") == one_lookup_each(3)
    assert answers[6]["status"] == 200
    assert whoami(answers[7])["host"] == "api.github.com"
    assert whoami(answers[8])["local"] == "140.82.112.6"
    assert events[-1]["fields"]["denied"] == 6


# --- every address must pass -----------------------------------------------------------

@pytest.mark.parametrize("slipped, why", [
    ("10.0.0.5", "10.0.0.5: private address (10.0.0.0/8), inside a private network, not on the internet"),
    ("127.0.0.1", "127.0.0.1: loopback address (127.0.0.0/8), which reaches services on this machine"),
    ("::1", "::1: loopback address (::1/128), which reaches services on this machine"),
])
def test_one_private_address_among_public_ones_is_refused(world, user, clean_dns, slipped, why):
    world.dns_set("sneaky.world", ["140.82.112.61", slipped, "140.82.112.62"])
    policy = policy_file(world, 'default = "deny"\ndeny_private = true\nallow = ["sneaky.world"]\n')
    plan = three_doors("sneaky.world")
    lines_before = len(world.web_log())
    r, answers, events = guarded(world, user, policy, plan)
    assert r.returncode == 120, describe(r)
    reason = f"sneaky.world resolved to {why}"
    assert_http_denied(answers[0], reason)
    assert_http_denied(answers[1], reason)
    assert_socks_denied(answers[2])
    sneaky = conn_of(events, "sneaky.world", 443) + conn_of(events, "sneaky.world", 80)
    assert len(sneaky) == 3, sneaky
    for evs in sneaky:
        resolved = only(evs, "dns.resolve")["fields"]["addresses"]
        assert slipped in resolved and "140.82.112.61" in resolved, resolved
        assert denial(evs) == {"rule": "deny_private", "reason": reason, "enforced": True}
    assert len(world.web_log()) == lines_before, world.web_log()[lines_before:]
    # Control: without vpnw the same name is served (from a public address).
    control = world.run(["curl", "-sS", "-4", "--max-time", "20", "http://sneaky.world/whoami"])
    assert control.returncode == 0 and json.loads(control.stdout)["host"] == "sneaky.world", describe(control)


# --- rebinding -----------------------------------------------------------------------------

class Running:
    """A vpnw run in the world whose program pauses; stdout read line by line."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.buf = b""
        self.lines: list[str] = []

    def line(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self.buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise AssertionError(f"no line from the program in {timeout} s: {self.buf!r}")
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    raise AssertionError(f"the run ended early: {self.buf!r}, "
                                         f"stderr {self.proc.stderr.read().decode(errors='replace')}")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        self.lines.append(line.decode())
        return self.lines[-1]

    def finish(self, stdin: bytes, timeout: float = 60) -> tuple[int, str, str]:
        out, err = self.proc.communicate(stdin, timeout=timeout)
        rest = (self.buf + out).decode()
        return self.proc.returncode, "\n".join(self.lines + rest.splitlines()), err.decode(errors="replace")


def test_rebinding_between_connections_never_reaches_the_new_address(world, user, clean_dns):
    world.dns_set("rebind.world", ["140.82.112.50"])
    policy = policy_file(world, 'default = "deny"\ndeny_private = true\nallow = ["rebind.world"]\n')
    tag = uuid.uuid4().hex
    plan = [{"op": "get", "url": f"http://rebind.world/whoami?first={tag}"},
            {"op": "pause", "tag": "rebind"},
            {"op": "get", "url": f"http://rebind.world/whoami?second={tag}"},
            {"op": "connect", "host": "rebind.world", "port": 80, "get": f"/whoami?second={tag}"},
            {"op": "socks", "host": "rebind.world", "atyp": "domain", "port": 80, "get": f"/whoami?second={tag}"}]
    program, plan_file = probe(world, plan)
    mark = world.dns_mark()
    proc = world.popen([str(world.vpnw_path), "guard", "--policy", policy, "--", sys.executable,
                        program, plan_file], user=user, stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    running = Running(proc)
    try:
        first = json.loads(running.line())
        assert json.loads(running.line()) == {"paused": "rebind"}
        # The first connection: one look-up, dialled at exactly what was checked.
        assert lookups(world, mark, "rebind.world") == one_lookup_each(1)
        world.dns_set("rebind.world", ["169.254.169.254"])
        code, stdout, stderr = running.finish(b"go\n")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert first["status"] == 200 and json.loads(first["body"])["local"] == "140.82.112.50", first
    answers = [json.loads(line) for line in stdout.splitlines()]
    assert code == 120, (code, stdout, stderr)
    reason = f"rebind.world resolved to {METADATA_REASON}"
    assert_http_denied(answers[3], reason)
    assert_http_denied(answers[4], reason)
    assert_socks_denied(answers[5])

    files = sorted((proc.state_home / "vpnw" / "runs").glob("*.jsonl"))
    assert len(files) == 1
    events = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert check_run(events) == []
    conns = conn_of(events, "rebind.world", 80)
    assert len(conns) == 4
    resolved = only(conns[0], "dns.resolve")["fields"]["addresses"]
    assert resolved == ["140.82.112.50"]
    assert only(conns[0], "conn.open")["fields"]["address"] == "140.82.112.50"
    for evs in conns[1:]:
        assert only(evs, "dns.resolve")["fields"]["addresses"] == ["169.254.169.254"]
        assert denial(evs) == {"rule": "deny_private", "reason": reason, "enforced": True}
    assert lookups(world, mark, "rebind.world") == one_lookup_each(4)
    # No request of the second round reached any server.
    log = world.web_log()
    assert sum(f"first={tag}" in line for line in log) == 1
    assert not [line for line in log if f"second={tag}" in line]
    # Control: without vpnw, the rebound name does lead to the metadata address.
    control = world.run(["curl", "-sS", "--max-time", "20", f"http://rebind.world/whoami?control={tag}"])
    assert control.returncode == 0 and json.loads(control.stdout)["local"] == "169.254.169.254", describe(control)


# --- a kept-alive connection: each request decided on its own ---------------------------------

@pytest.mark.parametrize("pipelined", [False, True], ids=["one-by-one", "pipelined"])
def test_keepalive_second_request_to_a_denied_host_gets_403(world, user, pipelined):
    policy = policy_file(world, DEFAULT_DENY)
    tag = uuid.uuid4().hex
    urls = [f"http://api.github.com/whoami?ka1={tag}", f"http://evil.example/whoami?ka2={tag}",
            f"http://api.github.com/whoami?ka3={tag}"]
    mark = world.dns_mark()
    r, answers, events = guarded(world, user, policy,
                                 [{"op": "keepalive", "urls": urls, "pipelined": pipelined}])
    assert r.returncode == 120, describe(r)
    responses = answers[0]["responses"]
    # The first answer intact, the second a 403, then the proxy closes.
    assert len(responses) == 3 and responses[2].get("eof"), responses
    assert responses[0]["status"] == 200
    seen = json.loads(responses[0]["body"])
    assert seen["host"] == "api.github.com" and seen["local"] == "140.82.112.6"
    assert int(responses[0]["headers"]["content-length"]) == len(responses[0]["body"].encode())
    assert_http_denied(responses[1], 'evil.example:80 matches deny rule "*.example" (%s line 7)' % policy)
    assert [evs[0]["fields"]["host"] for _, evs in sorted(connections(events).items())] == \
        ["api.github.com", "evil.example"]
    assert "evil.example" not in world.dns_queries(since=mark)
    log = world.web_log()
    assert sum(f"ka1={tag}" in line for line in log) == 1
    assert not [line for line in log if f"ka2={tag}" in line or f"ka3={tag}" in line]


# --- denials in each door's own terms, and the human line ---------------------------------------

def test_denial_in_each_doors_terms_and_the_human_deny_line(world, user):
    policy = policy_file(world, 'default = "deny"\ndeny_private = true\nallow = ["api.github.com"]\n')
    plan = three_doors("evil.example")
    r, answers, events = guarded(world, user, policy, plan)
    assert r.returncode == 120, describe(r)
    reason443 = "no allow rule matches evil.example:443; default is deny (set in the policy)"
    reason80 = "no allow rule matches evil.example:80; default is deny (set in the policy)"
    assert_http_denied(answers[0], reason443)
    assert_http_denied(answers[1], reason80)
    assert_socks_denied(answers[2])
    evil = conn_of(events, "evil.example", 443) + conn_of(events, "evil.example", 80)
    assert len(evil) == 3, evil
    for evs in evil:
        conn = evs[0]["conn"]
        fields = denial(evs)
        assert fields["rule"] == "default" and fields["enforced"] is True
        port = evs[0]["fields"]["port"]
        expected = (f"#{conn}".ljust(5) + f"  DENY   evil.example:{port}  "
                    f"no allow rule matches evil.example:{port}; default is deny (set in the policy)")
        lines = [line for line in r.stderr.splitlines() if re.fullmatch(rf"vpnw {HUMAN_TIME}  " + re.escape(expected), line)]
        assert len(lines) == 1, (expected, r.stderr)
    # The description's own line, for connection 1 (the CONNECT).
    assert re.search(rf"^vpnw {HUMAN_TIME}  #1     DENY   evil\.example:443  no allow rule matches "
                     r"evil\.example:443; default is deny \(set in the policy\)$", r.stderr, re.M), r.stderr


# --- exit codes ------------------------------------------------------------------------------------

EXIT_POLICY = 'default = "deny"\ndeny_private = true\nallow = ["api.github.com"]\n'


@pytest.mark.parametrize("program_exit, denied, expected", [
    (0, True, 120), (3, True, 120), (0, False, 0), (3, False, 3)])
def test_guard_exit_codes(world, user, program_exit, denied, expected):
    policy = policy_file(world, EXIT_POLICY)
    plan = [{"op": "connect", "host": "api.github.com", "port": 443}]
    if denied:
        plan.append({"op": "connect", "host": "evil.example", "port": 443})
    r, answers, events = guarded(world, user, policy, plan, program_exit=program_exit)
    assert r.returncode == expected, describe(r)
    assert answers[0]["status"] == 200
    assert events[-1]["fields"]["exit_code"] == expected
    assert events[-1]["fields"]["denied"] == int(denied)
    assert only(events, "program.exit")["fields"]["code"] == program_exit


@pytest.mark.parametrize("mode", ["run", "trace"])
def test_run_and_trace_with_a_policy_enforce_it(world, user, mode):
    policy = policy_file(world, EXIT_POLICY)
    r, answers, events = guarded(world, user, policy, three_doors("evil.example"), mode=mode)
    assert r.returncode == 120, describe(r)
    assert events[0]["fields"]["mode"] == mode and events[0]["fields"]["policy_file"] == policy
    assert_http_denied(answers[0], "no allow rule matches evil.example:443; default is deny (set in the policy)")
    assert_http_denied(answers[1], "no allow rule matches evil.example:80; default is deny (set in the policy)")
    assert_socks_denied(answers[2])
    assert events[-1]["fields"]["denied"] == 3
    assert len(re.findall(r"^vpnw .*  DENY   evil\.example:", r.stderr, re.M)) == 3, r.stderr


def test_guard_dry_run_lets_it_through_but_records_and_exits_120(world, user):
    policy = policy_file(world, EXIT_POLICY)
    plan = [{"op": "connect", "host": "evil.example", "port": 80, "get": "/whoami"},
            {"op": "get", "url": "http://evil.example/whoami"},
            {"op": "socks", "host": "evil.example", "atyp": "domain", "port": 80, "get": "/whoami"}]
    mark = world.dns_mark()
    r, answers, events = guarded(world, user, policy, plan, extra=("--dry-run",))
    assert r.returncode == 120, describe(r)
    for answer in answers:
        seen = whoami(answer)
        assert seen["host"] == "evil.example" and seen["local"] == "203.0.113.66", answer
    reason = "no allow rule matches evil.example:80; default is deny (set in the policy)"
    conns = conn_of(events, "evil.example", 80)
    assert len(conns) == 3
    for evs in conns:
        assert only(evs, "policy.deny")["fields"].items() >= {
            "rule": "default", "reason": reason, "enforced": False, "host": "evil.example", "port": 80}.items()
        assert only(evs, "conn.open")["fields"]["address"] == "203.0.113.66"
        assert only(evs, "conn.close")
        # Under a default of deny nothing needed the address to decide: one look-up, to dial.
        only(evs, "dns.resolve")
    assert lookups(world, mark, "evil.example") == one_lookup_each(3)
    end = events[-1]["fields"]
    assert end["would_deny"] == 3 and end["denied"] == 0 and events[0]["fields"]["dry_run"] is True
    assert len(re.findall(rf"^vpnw {HUMAN_TIME}  #\d +  WOULD DENY   evil\.example:80  "
                          + re.escape(reason) + "$", r.stderr, re.M)) == 3, r.stderr
    assert not re.search(r"  DENY   ", r.stderr), r.stderr


def test_dry_run_dials_only_the_addresses_it_checked(world, user):
    """Under --dry-run a denied private address is still dialled — the one that
    was checked, with no second look-up."""
    policy = policy_file(world, 'default = "deny"\ndeny_private = true\nallow = ["metadata.world"]\n')
    mark = world.dns_mark()
    r, answers, events = guarded(world, user, policy,
                                 [{"op": "get", "url": "http://metadata.world/whoami"}], extra=("--dry-run",))
    assert r.returncode == 120, describe(r)
    assert whoami(answers[0])["local"] == "169.254.169.254"
    (evs,) = conn_of(events, "metadata.world", 80)
    fields = only(evs, "policy.deny")["fields"]
    assert {**fields, "reason": without_the_setting(fields["reason"])} == {
        "rule": "deny_private", "reason": f"metadata.world resolved to {METADATA_REASON}", "enforced": False,
        "host": "metadata.world", "port": 80, "door": "http"}
    assert only(evs, "conn.open")["fields"]["address"] == "169.254.169.254"
    assert lookups(world, mark, "metadata.world") == one_lookup_each(1)


# --- IP literals and ports --------------------------------------------------------------------------

LITERAL_POLICY = 'default = "deny"\ndeny_private = true\nallow = ["140.82.112.0/20"]\n'
MAPPED_REASON = ("::ffff:7f00:1: IPv4-mapped IPv6 address (::ffff:0:0/96) carrying 127.0.0.1, a loopback "
                 "address (127.0.0.0/8), which reaches services on this machine")
DIGITS_REASON = ("'2130706433' is a host name made only of digits, which resolvers read as an IPv4 "
                 "address written as one number; refused")
SHORT_REASON = ("'0x7f.1' is not the dotted-decimal spelling of an IPv4 address (octal, hexadecimal, "
                "short forms and trailing dots are read differently by different programs); refused")


def test_ip_literals_are_refused_with_the_exact_reason(world, user):
    policy = policy_file(world, LITERAL_POLICY)
    cases = [  # (CONNECT host, SOCKS host, SOCKS address type, record host, rule, reason)
        ("169.254.169.254", "169.254.169.254", "ipv4", "169.254.169.254", "deny_private", METADATA_REASON),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1", "ipv6", None, "deny_private", MAPPED_REASON),
        ("2130706433", "2130706433", "domain", "2130706433", "target", DIGITS_REASON),
        ("0x7f.1", "0x7f.1", "domain", "0x7f.1", "target", SHORT_REASON),
    ]
    plan = []
    for connect_host, socks_host, atyp, *_ in cases:
        plan += [{"op": "connect", "host": connect_host, "port": 443},
                 {"op": "socks", "host": socks_host, "atyp": atyp, "port": 443}]
    plan += [{"op": "connect", "host": "140.82.112.6", "port": 80, "get": "/whoami", "host_header": "api.github.com"},
             {"op": "socks", "host": "140.82.112.6", "atyp": "ipv4", "port": 80, "get": "/whoami",
              "host_header": "api.github.com"}]
    mark = world.dns_mark()
    r, answers, events = guarded(world, user, policy, plan)
    assert r.returncode == 120, describe(r)
    by_conn = sorted(requests_by_conn(events).items())
    assert len(by_conn) == len(plan)
    for i, (_, _, _, record_host, rule, reason) in enumerate(cases):
        assert_http_denied(answers[2 * i], reason)
        assert_socks_denied(answers[2 * i + 1])
        for evs in (by_conn[2 * i][1], by_conn[2 * i + 1][1]):
            if record_host is not None:
                assert evs[0]["fields"]["host"] == record_host, evs
            assert denial(evs) == {"rule": rule, "reason": reason, "enforced": True}
    for answer in answers[-2:]:
        assert whoami(answer)["local"] == "140.82.112.6", answer
    for _, evs in by_conn[-2:]:
        assert only(evs, "policy.allow")["fields"]["rule"] == 'allow "140.82.112.0/20" (line 6)'
        assert only(evs, "conn.open")["fields"]["address"] == "140.82.112.6"
    # An address needs no look-up: nothing was asked of the DNS server.
    assert not any(e["type"] == "dns.resolve" for e in events)
    assert world.dns_queries(since=mark) == []
    # Control: the metadata address answers when asked directly from the world.
    control = world.run(["curl", "-sS", "--max-time", "20", "http://169.254.169.254/whoami"])
    assert control.returncode == 0 and json.loads(control.stdout)["local"] == "169.254.169.254", describe(control)


def test_a_port_in_a_rule_allows_that_port_only(world, user):
    policy = policy_file(world, 'default = "deny"\ndeny_private = true\nallow = ["api.github.com:443"]\n')
    mark = world.dns_mark()
    r, answers, events = guarded(world, user, policy, [
        {"op": "connect", "host": "api.github.com", "port": 443},
        {"op": "socks", "host": "api.github.com", "atyp": "domain", "port": 443},
        {"op": "connect", "host": "api.github.com", "port": 80},
        {"op": "get", "url": "http://api.github.com/whoami"},
        {"op": "socks", "host": "api.github.com", "atyp": "domain", "port": 80}])
    assert r.returncode == 120, describe(r)
    assert answers[0]["status"] == 200
    assert answers[1]["reply"] == 0
    reason = "no allow rule matches api.github.com:80; default is deny (set in the policy)"
    assert_http_denied(answers[2], reason)
    assert_http_denied(answers[3], reason)
    assert_socks_denied(answers[4])
    assert len(conn_of(events, "api.github.com", 443)) == 2
    assert len(conn_of(events, "api.github.com", 80)) == 3
    for evs in conn_of(events, "api.github.com", 443):
        assert only(evs, "policy.allow")["fields"]["rule"] == 'allow "api.github.com:443" (line 6)'
    for evs in conn_of(events, "api.github.com", 80):
        assert denial(evs)["rule"] == "default"
    # Port 80 is denied before any look-up; 443 looked up once per connection.
    assert lookups(world, mark, "api.github.com") == one_lookup_each(2)


# --- a request sent as the program exits --------------------------------------------------------

# Sends one request through each door without waiting for any answer, and
# exits at once: the connections are still in the doors' backlogs when the
# helper ends (at the start of a run, before the broker's loop has loaded).
HIT_AND_RUN = prog_text("hit_and_run.py")


@pytest.mark.parametrize("program_exit", [0, 3])
def test_requests_sent_as_the_program_exits_reach_the_record_and_guard_says_120(world, user, program_exit):
    policy = policy_file(world, EXIT_POLICY)
    program = world.file("hit_and_run.py", HIT_AND_RUN)
    r = world.vpnw(["guard", "--policy", policy, "--", sys.executable, str(program), str(program_exit)],
                   user=user, timeout=120)
    assert r.returncode == 120, describe(r)
    events = run_events(r)
    http = conn_of(events, "evil.example", 80, "http-forward")
    socks = conn_of(events, "evil.example", 443, "socks5")
    assert len(http) == 1 and len(socks) == 1, [e["type"] for e in events]
    for evs in http + socks:
        assert denial(evs)["rule"] == "default"
    assert events[-1]["fields"]["denied"] == 2 and events[-1]["fields"]["connections"] == 2
    assert check_run(events) == []

"""Issue 25: the ways around capture and the DNS door (docs/architecture.md,
"Capture", "The DNS door"), one test each, through a real `vpnw guard
--capture` in the test world, as root and as vpnwtest.

One script makes every attempt and prints one JSON line each; it runs once
per user inside (a policy with capture, deny_private and an allow list that
names neither evil.example nor the made-up names), once in the world as the
same user (the control: the attempt itself works there, or needs root
there too), and once in a scratch user+net namespace of the user's own for
the netfilter change. Each attempt lists the errors it accepts inside;
anything else fails, success included. The witness that nothing was looked
up is the world's DNS log: every name an attempt asks for carries a marker
of this run.
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil

import pytest

from ci_support import cannot
from e2e_support import assert_every_connection_accounted, describe, run_events
from progs_support import prog_text
from world import DEFAULT_NAMES, DNS_ADDR, WORLD_V6

pytestmark = pytest.mark.world

V6 = DEFAULT_NAMES["dual.world"][1]
WORLD_HOST = DEFAULT_NAMES["api.github.com"][0]
FLOOD = 3000
POOL = ipaddress.ip_network("198.18.0.0/15")
NO_PROXY_ENV = ["env", "-u", "HTTP_PROXY", "-u", "HTTPS_PROXY", "-u", "ALL_PROXY",
                "-u", "http_proxy", "-u", "https_proxy", "-u", "all_proxy"]

ATTEMPTS = prog_text("capture_bypass.py")

# id -> errors accepted inside. None: the attempt reaches the broker and must
# work as the policy says (asserted by its own test below).
REFUSED_INSIDE = {
    # seccomp refuses the packet family; no capability is left for the rest.
    "raw": {"EPERM"}, "packet": {"EAFNOSUPPORT", "EPERM"}, "so-mark": {"EPERM"},
    "ip-transparent": {"EPERM"},
    "nft": {"EPERM"},
    # The table rejects UDP to anywhere but 53.
    "udp-not-53": {"EPERM", "ECONNREFUSED"},
    # Denied by the policy at the capture door: a plain HTTP request gets
    # vpnw's 403 with the reason (EACCES here); another protocol the reset.
    "refused-name": {"EACCES"},
    "door-port-elsewhere": {"ECONNRESET", "EPIPE"},
    "capture-door-itself": {"ECONNRESET", "EPIPE"},
    "made-up-address-of-another-run": {"EACCES"},
    # A read-only bind, and a mount point cannot be renamed over.
    "resolv-write": {"EROFS", "EACCES"}, "resolv-rename": {"EBUSY", "EROFS", "EACCES", "EXDEV"},
}
# The same attempt outside works, or needs root there too.
ROOT_ONLY_OUTSIDE = {"raw", "packet", "so-mark", "ip-transparent"}
NO_CONTROL = {
    "door-port-elsewhere": "outside there is no capture door; inside the port is an ordinary port",
    "capture-door-itself": "outside there is no capture door",
    "made-up-address-of-another-run": "outside, the pool's addresses are nobody's",
    "resolv-write": "outside it would change the machine's resolver; dns-udp-another-server shows "
                    "what a changed file would do",
    "resolv-rename": "outside it would change the machine's resolver",
}
DNS_ATTEMPTS = {"dns-udp-another-server", "dns-tcp-another-server", "dns-txt", "dns-any", "dns-axfr"}


def results(stdout: str) -> dict[str, dict]:
    return {r.pop("id"): r for r in map(json.loads, (l for l in stdout.splitlines() if l.startswith("{")))}


class CaptureBench:
    """The three runs per user, each made once."""

    def __init__(self, world):
        self.world = world
        self.script = world.file("capture_bypass.py", ATTEMPTS)
        self.cache: dict = {}

    def marker(self, user: str) -> str:
        """In every name an attempt asks for: this worker's, this user's."""
        return f"m{user}{os.getpid()}"

    def args(self, where: str, user: str) -> list[str]:
        return [str(self.script), where, self.marker(user), V6, DNS_ADDR, WORLD_HOST, str(FLOOD)]

    def inside(self, user: str):
        if ("inside", user) not in self.cache:
            policy = self.world.file(
                f"capture-bypass-{user}.toml",
                f'version = 1\n[policy]\ncapture = true\ndeny_private = true\n'
                f'allow = ["dual.world", "{V6}"]\n')
            mark = self.world.dns_mark()
            r = self.world.vpnw(["guard", "--policy", str(policy), "--", *NO_PROXY_ENV, "python3",
                                 *self.args("inside", user)], user=user, timeout=180)
            assert r.returncode == 120, describe(r)
            self.cache["inside", user] = (r, results(r.stdout), run_events(r), self.world.dns_queries(mark))
        return self.cache["inside", user]

    def outside(self, user: str, where: str):
        if (where, user) not in self.cache:
            mark = self.world.dns_mark()
            prefix = ["unshare", "-Urn"] if where == "scratch" else []
            r = self.world.run([*prefix, "python3", *self.args(where, user)], user=user, timeout=120)
            assert r.returncode == 0, describe(r)
            self.cache[where, user] = (results(r.stdout), self.world.dns_queries(mark))
        return self.cache[where, user]


@pytest.fixture(scope="module")
def capture_bench(world):
    if shutil.which("nft") is None:
        cannot("capture's tests need nft (scripts/setup installs nftables)")
    return CaptureBench(world)


@pytest.mark.parametrize("attempt", sorted(REFUSED_INSIDE))
def test_refused_inside_with_its_control(capture_bench, user, attempt):
    r, got, events, _ = capture_bench.inside(user)
    res = got[attempt]
    assert not res["ok"], f"a way out: {attempt} worked inside: {res}\n{describe(r)}"
    assert res["error"] in REFUSED_INSIDE[attempt], f"{attempt}: {res}\n{describe(r)}"
    if res["error"] == "EACCES" and attempt not in ("resolv-write", "resolv-rename"):
        assert res["said"].startswith("vpnw: ") and " denied: " in res["said"], res
    assert_every_connection_accounted(events)
    assert not [e for e in events if e["type"] == "conn.open" and e["fields"].get("port") in (1080, 1081)]
    if attempt in NO_CONTROL:
        return
    where = "scratch" if attempt == "nft" else "world"
    control, _ = capture_bench.outside(user, where)
    if attempt in ROOT_ONLY_OUTSIDE and user != "root":
        assert not control[attempt]["ok"] and control[attempt]["error"] == "EPERM", control[attempt]
    else:
        assert control[attempt]["ok"], f"control outside: {control[attempt]}"


def test_denied_connections_are_decided_and_recorded_never_dialled(capture_bench, user):
    r, _, events, queries = capture_bench.inside(user)
    requests = {(e["fields"]["host"], e["fields"]["port"]): e for e in events if e["type"] == "conn.request"}
    assert all(e["fields"]["door"] == "capture" for e in requests.values()), describe(r)
    denied = {e["conn"]: e["fields"] for e in events if e["type"] == "policy.deny"}
    # A name the policy refuses: decided by name, never looked up.
    name = f"refused-{capture_bench.marker(user)}.evil.example"
    assert requests[(name, 80)]["conn"] in denied, describe(r)
    assert name not in queries
    # A door's port at another address is that address's port, decided as such.
    assert requests[("198.51.100.7", 1080)]["conn"] in denied
    # The capture door reached directly: the machine's loopback, which deny_private refuses
    # (or a connection with no original destination at all); never dialled.
    direct = [e for e in events if e["type"] in ("conn.request", "conn.fail")
              and (e["fields"].get("port") == 1081 or "original destination" in e["fields"].get("reason", ""))]
    assert direct, describe(r)
    # Another run's made-up address: refused by the DNS door's rule.
    other = [f for conn, f in denied.items() if f.get("rule") == "dns-door"]
    assert other, describe(r)


def test_ipv6_is_captured_like_ipv4(capture_bench, user):
    r, got, events, _ = capture_bench.inside(user)
    assert got["ipv6"]["ok"] and got["ipv6"]["seen"]["peer"] == WORLD_V6, describe(r)
    requests = [e["fields"] for e in events if e["type"] == "conn.request"]
    assert {"door": "capture", "kind": "capture", "host": V6, "port": 80} in requests
    control, _ = capture_bench.outside(user, "world")
    assert control["ipv6"]["ok"], control["ipv6"]


@pytest.mark.parametrize("attempt", sorted(DNS_ATTEMPTS))
def test_dns_to_any_server_reaches_the_door_and_nothing_is_looked_up(capture_bench, user, attempt):
    r, got, events, queries = capture_bench.inside(user)
    res = got[attempt]
    assert res["ok"], f"{attempt}: {res}\n{describe(r)}"
    expected = {"dns-udp-another-server": "NOERROR", "dns-tcp-another-server": "NOERROR",
                "dns-txt": "NOERROR", "dns-any": "REFUSED", "dns-axfr": "REFUSED"}[attempt]
    assert res["rcode"] == expected, res
    if attempt.endswith("another-server"):
        assert ipaddress.ip_address(res["address"]) in POOL, res      # the door's made-up answer
    elif attempt == "dns-txt":
        assert res["ancount"] == 0, res                             # NODATA: nothing carried out
    marker = capture_bench.marker(user)
    marked = [q for q in queries if marker in q]
    assert marked == [], f"looked up from inside: {marked}"
    answers = [e["fields"] for e in events if e["type"] == "dns.answer"]
    assert any(a["name"].startswith(f"{attempt_prefix(attempt)}-{marker}.") for a in answers), answers
    # Control: outside, the same queries reach the world's server, which logs them.
    control, control_queries = capture_bench.outside(user, "world")
    assert control[attempt]["ok"], control[attempt]
    assert any(marker in q for q in control_queries), control_queries


def attempt_prefix(attempt: str) -> str:
    return {"dns-udp-another-server": "udp", "dns-tcp-another-server": "tcp", "dns-txt": "exfil",
            "dns-any": "any", "dns-axfr": "axfr"}[attempt]


def test_a_flood_of_queries_is_bounded_and_every_answer_recorded(capture_bench, user):
    r, got, events, _ = capture_bench.inside(user)
    answers = [e for e in events if e["type"] == "dns.answer"
               and e["fields"]["name"].startswith(f"flood-{capture_bench.marker(user)}-")]
    assert got["flood"]["ok"] and 0 < got["flood"]["answered"] <= len(answers) <= FLOOD, describe(r)
    assert events[-1]["type"] == "run.end"

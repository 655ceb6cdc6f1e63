"""Paths end to end: `vpnw --config --via` through REAL exits inside the test world.

The exits (danted, microsocks, tinyproxy, squid from Debian's packages) run in
an "office" network namespace of their own, 10.8.0.1, behind the world's
internet (world.exit_site). Each has a private /etc/resolv.conf (the world's
DNS server) and /etc/hosts naming tracker.office.internal -> 10.9.0.80, a name
the world's DNS server (and so vpnw's broker) does not know.

What the world observes proves where each connection came from: the web
server's /whoami and access log give the peer address (10.8.0.1 through an
exit, 10.200.0.1 straight from the world), and the DNS log says who looked up
which name.
"""
from __future__ import annotations

import base64
import functools
import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest

from ci_support import cannot

import exits
from e2e_support import assert_every_connection_accounted, describe, run_events
from progs_support import prog_text
from stages.record.check import check_run
from world import DNS_ADDR, GIT_README, WORLD_V4

pytestmark = pytest.mark.world

SITE = "10.8.0.1"
INTERNAL = "tracker.office.internal"
INTERNAL_ADDRESS = "10.9.0.80"
GITHUB = "140.82.112.6"
SOCKS_PASSWORD = "socks-Pw-4kT9"
HTTP_PASSWORD = "http-Pw-8vQ2"
WRONG_PASSWORD = "wrong-Pw-7Zq3"
PASSWORD_ENV = "OFFICE_SOCKS_PASSWORD"

# path name -> (exit kind, port, scheme, username or None)
PATHS = {
    "danted": ("danted", 1080, "socks5h", None),
    "danted-here": ("danted", 1080, "socks5", None),        # vpnw resolves, sends addresses
    "micro-auth": ("microsocks", 1081, "socks5h", "alice"),
    "micro-auth-here": ("microsocks", 1081, "socks5", "alice"),
    "tiny": ("tinyproxy", 3128, "http", None),
    "tiny-auth": ("tinyproxy", 3129, "http", "bob"),
    "squid": ("squid", 3130, "http", None),
    "squid-auth": ("squid", 3131, "http", "carol"),
}
DOWN_PORT = 1099          # nothing listens there
DYING = {"microsocks": 1095, "tinyproxy": 3195}


class Site:
    """The office namespace, its exits and a config naming them."""

    def __init__(self, world):
        self.world = world
        self.netns = exits.PrivateNetns(join_pid=world.exit_site(SITE))
        self.exits: dict[tuple[str, int], exits.Exit] = {}
        for kind, port, _, username in PATHS.values():
            if (kind, port) not in self.exits:
                password = SOCKS_PASSWORD if kind == "microsocks" else HTTP_PASSWORD
                self.exits[(kind, port)] = self.start(kind, port, username,
                                                      password if username else None)
        self.password_file = world.file("office.pass", HTTP_PASSWORD + "\n")
        self.config = world.file("office.toml", self.config_text())

    def start(self, kind, port, username=None, password=None) -> exits.Exit:
        return self.netns.run(functools.partial(
            exits.start_exit, kind, port, username, password, hosts={INTERNAL: INTERNAL_ADDRESS},
            listen=SITE, resolver=DNS_ADDR))

    def config_text(self, *, password_file=None, default=None, extra="") -> str:
        password_file = password_file or self.password_file
        lines = ['version = 1', 'name = "office"']
        if default:
            lines.append(f'default = "{default}"')
        for name, (kind, port, scheme, username) in PATHS.items():
            lines += ["", f"[paths.{name}]", 'type = "proxy"', f'url = "{scheme}://{SITE}:{port}"']
            if username and kind == "microsocks":
                lines += [f'username = "{username}"', f'password_env = "{PASSWORD_ENV}"']
            elif username:
                lines += [f'username = "{username}"', f'password_file = "{password_file}"']
        for kind, port in DYING.items():
            scheme = "http" if kind == "tinyproxy" else "socks5h"
            lines += ["", f"[paths.dying-{kind}]", 'type = "proxy"', f'url = "{scheme}://{SITE}:{port}"']
        lines += ["", "[paths.down]", 'type = "proxy"', f'url = "socks5h://{SITE}:{DOWN_PORT}"']
        return "\n".join(lines) + "\n" + extra

    def vpnw(self, args, *, user, config=None, env=None, **kw):
        env = {PASSWORD_ENV: SOCKS_PASSWORD, **(env or {})}
        mode, rest = args[0], list(args[1:])
        return self.world.vpnw([mode, "--config", str(config or self.config), *rest],
                               user=user, env=env, **kw)

    def close(self):
        for exit_ in self.exits.values():
            exit_.stop()
        self.netns.close()


@pytest.fixture(scope="module")
def site(world):
    missing = [m for m in (exits.missing(k) for k in ("danted", "microsocks", "tinyproxy", "squid")) if m]
    if missing:
        cannot("; ".join(missing))
    s = Site(world)
    try:
        yield s
    finally:
        s.close()


# ── helpers ────────────────────────────────────────────────────────────────

def whoamis(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def web_mark(world) -> int:
    return len(world.web_log())


def web_since(world, mark: int) -> list[str]:
    return world.web_log()[mark:]


def checked_events(result) -> list[dict]:
    events = run_events(result)
    assert check_run(events) == [], check_run(events)
    assert_every_connection_accounted(events)
    return events


def of_type(events, type_) -> list[dict]:
    return [e for e in events if e["type"] == type_]


def assert_carried_by(events, path_name: str) -> None:
    """Every event names the path in its envelope; every opened connection says `via` it."""
    assert {e["path"] for e in events} == {path_name}, {e["path"] for e in events}
    opens = of_type(events, "conn.open")
    assert opens, [e["type"] for e in events]
    assert {e["fields"]["via"] for e in opens} == {path_name}, opens


CLIENTS = prog_text("paths_clients.sh")

EXPECTED_HOSTS = ["api.github.com", "api.github.com", "github.com",
                  "files.pythonhosted.org", "files.pythonhosted.org"]


# ── curl, Python and git through every kind of exit ───────────────────────

@pytest.mark.parametrize("path_name", list(PATHS))
def test_clients_reach_the_world_through_the_exit(site, user, path_name):
    world = site.world
    kind, port, scheme, username = PATHS[path_name]
    resolves_at_exit = scheme != "socks5"
    program = world.file("paths_clients.sh", CLIENTS)
    work = world.workdir(user)
    web, dns = web_mark(world), world.dns_mark()
    r = site.vpnw(["run", "--via", path_name, "--", "sh", str(program), str(world.ca_pem), str(work),
                   "yes" if resolves_at_exit else "no", sys.executable, INTERNAL], user=user, timeout=120)
    assert r.returncode == 0, describe(r)

    seen = whoamis(r.stdout)
    hosts = EXPECTED_HOSTS + ([INTERNAL, INTERNAL] if resolves_at_exit else [])
    assert [s["host"] for s in seen] == hosts, seen
    # Every connection reached the server from the exit, none from the world itself.
    assert {s["peer"] for s in seen} == {SITE}, seen
    assert f"README: {GIT_README.strip()}" in r.stdout
    if resolves_at_exit:
        # The exit's own /etc/hosts answered for the internal name.
        assert [s["local"] for s in seen if s["host"] == INTERNAL] == [INTERNAL_ADDRESS] * 2
    peers = {line.split(" ", 1)[0] for line in web_since(world, web)}
    assert peers == {SITE}, web_since(world, web)

    # Who looked names up: the exit (from its address) or vpnw (from the world's).
    askers = {(name, client) for _, name, client in world.dns_query_log(dns)}
    if resolves_at_exit:
        # (Whether the exit itself asked depends on its cache: danted and squid keep one.)
        assert not {a for a in askers if a[1] == WORLD_V4}, askers
        assert INTERNAL not in {name for name, _ in askers}, askers
    else:
        assert ("api.github.com", WORLD_V4) in askers and not {a for a in askers if a[1] == SITE}, askers

    events = checked_events(r)
    assert_carried_by(events, path_name)
    check = of_type(events, "path.check")
    assert len(check) == 1 and check[0]["fields"]["ok"] is True and check[0]["fields"]["path"] == path_name
    opens = [e["fields"] for e in of_type(events, "conn.open")]
    if resolves_at_exit:
        assert not of_type(events, "dns.resolve")
        assert {o["address"] for o in opens} == {"api.github.com", "github.com", "files.pythonhosted.org",
                                                "git.world", INTERNAL}, opens
    else:
        assert GITHUB in {o["address"] for o in opens}, opens
    assert of_type(events, "run.end")[0]["fields"]["exit_code"] == 0

    if username:
        password = SOCKS_PASSWORD if kind == "microsocks" else HTTP_PASSWORD
        for text in (r.stdout, r.stderr, r.run_files()[0].read_text()):
            assert password not in text


def test_internal_name_fails_when_vpnw_resolves_it(site, user):
    """The control for the internal name: on socks5:// vpnw resolves names with
    the world's DNS, which does not know it, so the connection fails there."""
    world = site.world
    dns = world.dns_mark()
    r = site.vpnw(["run", "--via", "danted-here", "--", "curl", "-sS", "--max-time", "20",
                   "--socks5-hostname", "127.0.0.1:1080", f"http://{INTERNAL}/whoami"], user=user)
    assert r.returncode == 97, describe(r)        # curl: the SOCKS5 proxy refused the request
    events = checked_events(r)
    fails = [e["fields"] for e in of_type(events, "conn.fail")]
    assert [(f["stage"], f["error"]) for f in fails] == [("resolve", "dns")], fails
    assert (INTERNAL, WORLD_V4) in {(n, c) for _, n, c in world.dns_query_log(dns)}


# ── failing closed ─────────────────────────────────────────────────────────

def test_exit_down_before_start_never_runs_the_program(site, user):
    world = site.world
    work = world.workdir(user)
    marker = work / "ran"
    web = web_mark(world)
    r = site.vpnw(["run", "--via", "down", "--", "sh", "-c",
                   f"touch {marker}; curl -sS http://api.github.com/whoami"], user=user)
    assert r.returncode == 123, describe(r)
    assert not marker.exists()
    assert "'down' is down" in r.stderr and "never falls back" in r.stderr, r.stderr
    # vpnw's message names the path once (it said "path down (socks5h://...) is down" again)
    said = [line for line in r.stderr.splitlines() if line.startswith("vpnw: the path ")]
    assert len(said) == 1 and said[0].startswith(
        f"vpnw: the path 'down' is down: socks5h://{SITE}:{DOWN_PORT}: "), r.stderr
    assert "path down" not in said[0] and said[0].count("is down") == 1, said
    assert web_since(world, web) == []
    events = checked_events(r)
    check = [e["fields"] for e in of_type(events, "path.check")]
    assert len(check) == 1 and check[0]["ok"] is False and check[0]["path"] == "down", check
    assert f"{SITE}:{DOWN_PORT}" in check[0]["error"], check
    assert of_type(events, "run.end")[0]["fields"]["exit_code"] == 123
    assert not of_type(events, "conn.request") and not of_type(events, "program.exit")
    # `show` says the reason once: on the DOWN line, which the summary points at
    shown = world.vpnw(["show"], user=user, state_home=r.state_home)
    assert shown.returncode == 0, describe(shown)
    assert shown.stdout.count(check[0]["error"]) == 1, shown.stdout
    assert "(why: on its DOWN line above); the program was not started" in shown.stdout, shown.stdout


KILLED = prog_text("killed_exit.sh")


def wait_for(path, process, what: str, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while not path.exists():
        if process.poll() is not None or time.monotonic() > end:
            out, err = process.communicate(timeout=30) if process.poll() is not None else (b"", b"")
            raise AssertionError(f"{what} never happened (vpnw {process.poll()})\n{out!r}\n{err!r}")
        time.sleep(0.02)


@pytest.mark.parametrize("kind", list(DYING))
def test_exit_killed_mid_run_fails_closed(site, user, kind):
    world = site.world
    exit_ = site.start(kind, DYING[kind])
    tag = uuid.uuid4().hex
    program = world.file(f"killed_{tag}.sh", KILLED)
    work = world.workdir(user)
    try:
        proc = world.popen([str(world.vpnw_path), "run", "--config", str(site.config),
                            "--via", f"dying-{kind}", "--", "sh", str(program), str(work), str(world.ca_pem), tag],
                           user=user, env={PASSWORD_ENV: SOCKS_PASSWORD},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for(work / "ready", proc, "the first connection")
    finally:
        exit_.stop()                      # by its process group id: we started it
    web, dns = web_mark(world), world.dns_mark()
    (work / "go").touch()
    out, err = proc.communicate(timeout=120)
    out, err = out.decode(), err.decode()
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert json.loads((work / "before.json").read_text())["peer"] == SITE

    # The program was told each time: 502 from the HTTP door, a failure reply from the SOCKS door.
    results = dict(line.split(" ", 1) for line in out.splitlines())
    assert results["forward"] == "0 502", out      # curl got an answer: vpnw's 502
    assert results["connect"] == "56", out         # CONNECT refused with 502
    assert results["socks"] == "97", out           # SOCKS5 request failed

    # Nothing left directly: the web server saw no connection at all after the kill,
    # and vpnw looked no name up (the exit resolves names on this path).
    assert web_since(world, web) == [], web_since(world, web)
    assert tag not in "\n".join(world.web_log())
    assert [q for q in world.dns_query_log(dns) if q[2] == WORLD_V4] == []

    files = sorted((proc.state_home / "vpnw" / "runs").glob("*.jsonl"))
    assert len(files) == 1
    events = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert check_run(events) == [], check_run(events)
    assert_every_connection_accounted(events)
    assert len(of_type(events, "conn.open")) == 1
    fails = [e["fields"] for e in of_type(events, "conn.fail")]
    assert len(fails) == 3 and {(f["stage"], f["error"]) for f in fails} == {("path", "path-down")}, fails
    assert all(f"dying-{kind}" in f["reason"] for f in fails), fails
    assert {e["path"] for e in events} == {f"dying-{kind}"}

    # The control: a connection made straight from the world does show up as the
    # world's address, so the log would have caught a fallback.
    mark = web_mark(world)
    control = world.run(["curl", "-sS", "--max-time", "20", "http://api.github.com/whoami"], check=True)
    assert json.loads(control.stdout)["peer"] == WORLD_V4
    assert web_since(world, mark)[0].startswith(WORLD_V4 + " ")


@pytest.mark.parametrize("path_name", ["micro-auth", "tiny-auth", "squid-auth"])
def test_wrong_password_stops_before_start_and_stays_secret(site, user, path_name):
    world = site.world
    wrong_file = world.file("wrong.pass", WRONG_PASSWORD + "\n")
    config = world.file("office-wrong.toml", site.config_text(password_file=wrong_file))
    work = world.workdir(user)
    r = site.vpnw(["run", "--via", path_name, "--", "touch", str(work / "ran")], user=user,
                  config=config, env={PASSWORD_ENV: WRONG_PASSWORD})
    assert r.returncode == 123, describe(r)
    assert not (work / "ran").exists()
    assert "refused the username/password" in r.stderr, r.stderr
    events = checked_events(r)
    check = [e["fields"] for e in of_type(events, "path.check")]
    assert check[0]["ok"] is False and "refused the username/password" in check[0]["error"], check
    shown = world.vpnw(["show"], user=user, state_home=r.state_home)
    assert shown.returncode == 0, describe(shown)
    username = PATHS[path_name][3]
    token = base64.b64encode(f"{username}:{WRONG_PASSWORD}".encode()).decode()
    for text in (r.stdout, r.stderr, r.run_files()[0].read_text(), shown.stdout, shown.stderr):
        assert WRONG_PASSWORD not in text and token not in text


# ── choosing the path ──────────────────────────────────────────────────────

def test_unknown_via_lists_the_known_names(site, user):
    work = site.world.workdir(user)
    r = site.vpnw(["run", "--via", "nowhere", "--", "touch", str(work / "ran")], user=user)
    assert r.returncode == 121, describe(r)
    assert not (work / "ran").exists() and r.run_files() == []
    known = re.search(r"known: ([^)]*)\)", r.stderr)
    assert known, r.stderr
    assert set(known.group(1).split(", ")) == set(PATHS) | {"direct", "down"} | {f"dying-{k}" for k in DYING}


def test_config_default_path_is_used_without_via(site, user):
    world = site.world
    config = world.file("office-default.toml", site.config_text(default="tiny"))
    r = site.vpnw(["run", "--", "curl", "-sS", "--max-time", "20", "http://api.github.com/whoami"],
                  user=user, config=config)
    assert r.returncode == 0, describe(r)
    assert whoamis(r.stdout)[0]["peer"] == SITE
    assert_carried_by(checked_events(r), "tiny")


def test_direct_with_a_config(site, user):
    world = site.world
    config = world.file("office-default.toml", site.config_text(default="tiny"))
    r = site.vpnw(["run", "--via", "direct", "--", "curl", "-sS", "--max-time", "20",
                   "http://api.github.com/whoami"], user=user, config=config)
    assert r.returncode == 0, describe(r)
    assert whoamis(r.stdout)[0]["peer"] == WORLD_V4
    events = checked_events(r)
    assert_carried_by(events, "direct")
    assert of_type(events, "path.check")[0]["fields"]["type"] == "direct"


# ── policies on a path that resolves at the exit ───────────────────────────

def test_name_allow_list_through_socks5h(site, user):
    # deny_private would refuse the internal name by name (.internal, reserved
    # for private use): a policy that reaches into the office network says so.
    world = site.world
    policy = world.file("paths_policy.toml", 'version = 1\nname = "agent"\n\n[policy]\n'
                        'default = "deny"\ndeny_private = false\n'
                        f'allow = ["api.github.com", "{INTERNAL}"]\n')
    tag = uuid.uuid4().hex
    web, dns = web_mark(world), world.dns_mark()
    r = site.vpnw(["guard", "--policy", str(policy), "--via", "danted", "--", "sh", "-c",
                   "curl -sS --max-time 20 http://api.github.com/whoami; echo; "
                   f"curl -sS --max-time 20 http://{INTERNAL}/whoami; echo; "
                   f"curl -sS --max-time 20 -o /dev/null -w '%{{http_code}}\\n' http://evil.example/whoami?tag={tag}"],
                  user=user)
    assert r.returncode == 120, describe(r)
    seen = whoamis(r.stdout)
    assert [(s["host"], s["peer"]) for s in seen] == [("api.github.com", SITE), (INTERNAL, SITE)], seen
    assert r.stdout.splitlines()[-1] == "403", r.stdout
    events = checked_events(r)
    denies = [e["fields"] for e in of_type(events, "policy.deny")]
    assert len(denies) == 1 and denies[0]["rule"] == "default", denies
    denied_conn = of_type(events, "policy.deny")[0]["conn"]
    assert [e["fields"]["host"] for e in of_type(events, "conn.request") if e["conn"] == denied_conn] == ["evil.example"]
    # Never sent to the exit: the exit would have looked it up and fetched it.
    assert "evil.example" not in world.dns_queries(dns)
    assert tag not in "\n".join(web_since(world, web))

    # The control: the same request through the same exit, from the world, gets there.
    web = web_mark(world)
    control = world.run(["curl", "-sS", "--max-time", "20", "-x", f"socks5h://{SITE}:1080",
                         f"http://evil.example/whoami?tag=control-{tag}"], check=True)
    seen = json.loads(control.stdout)
    assert (seen["host"], seen["peer"], seen["local"]) == ("evil.example", SITE, "203.0.113.66")
    assert [line.split(" ", 1)[0] for line in web_since(world, web) if tag in line] == [SITE]


def test_deny_private_with_default_allow_is_refused_on_socks5h(site, user):
    world = site.world
    policy = world.file("paths_private.toml", 'version = 1\nname = "agent"\n\n[policy]\n'
                        'default = "allow"\ndeny_private = true\n')
    work = world.workdir(user)
    r = site.vpnw(["guard", "--policy", str(policy), "--via", "danted", "--", "touch", str(work / "ran")],
                  user=user)
    assert r.returncode == 121, describe(r)
    assert "deny_private with a default of allow" in r.stderr and "resolves names at the exit" in r.stderr
    assert not (work / "ran").exists() and r.run_files() == []
    # The control: the same policy where vpnw resolves names is accepted.
    r = site.vpnw(["guard", "--policy", str(policy), "--via", "danted-here", "--", "touch",
                   str(work / "ran")], user=user)
    assert r.returncode == 0, describe(r)
    assert (work / "ran").exists()


def test_deny_private_on_socks5h_covers_literals_and_special_names_and_says_so(site, user, clean_dns):
    """What deny_private can do where the exit resolves names, and the one
    line that says what it cannot; run without the password of a path not
    chosen (only the chosen path's secrets are needed)."""
    world = site.world
    world.dns_set("meta.example", ["169.254.169.254"])
    # Unknown to the exit, so it would ask the DNS server (a new name each time: danted caches answers).
    hidden = f"svc-{uuid.uuid4().hex[:8]}.office.internal"
    policy = world.file("paths_scope.toml", 'version = 1\nname = "agent"\n\n[policy]\n'
                        'default = "deny"\ndeny_private = true\n'
                        f'allow = ["*.example", "140.82.112.0/24", "*.office.internal"]\n')
    dns = world.dns_mark()
    r = world.vpnw(["guard", "--config", str(site.config), "--via", "danted", "--policy", str(policy),
                    "--", "sh", "-c",
                    "curl -sS --max-time 20 http://meta.example/whoami; echo; "
                    "curl -sS --max-time 20 --socks5-hostname 127.0.0.1:1080 http://140.82.112.6/whoami; echo; "
                    "curl -sS -o /dev/null -w '%{http_code}\\n' http://169.254.169.254/whoami; "
                    f"curl -sS -o /dev/null -w '%{{http_code}}\\n' http://{hidden}/whoami"],
                   user=user, timeout=120)                  # no OFFICE_SOCKS_PASSWORD: not needed here
    assert r.returncode == 120, describe(r)
    seen = whoamis(r.stdout)
    # The limit, as the note says: a name is resolved at the exit, unchecked.
    assert [(s["host"], s["local"], s["peer"]) for s in seen] == \
        [("meta.example", "169.254.169.254", SITE), ("140.82.112.6", GITHUB, SITE)], seen
    assert r.stdout.splitlines()[-2:] == ["403", "403"], r.stdout
    notes = [line for line in r.stderr.splitlines() if "note: path danted resolves names at the exit" in line]
    assert len(notes) == 1 and "deny_private covers address literals and special names" in notes[0], r.stderr
    events = checked_events(r)
    assert events[0]["fields"]["deny_private_scope"] == "literals-and-names"
    denies = {e["conn"]: e["fields"] for e in of_type(events, "policy.deny")}
    hosts = {e["conn"]: e["fields"]["host"] for e in of_type(events, "conn.request")}
    assert {hosts[c]: d["rule"] for c, d in denies.items()} == \
        {"169.254.169.254": "deny_private", hidden: "deny_private"}, denies
    assert hidden not in world.dns_queries(dns)          # not looked up, nor sent to the exit
    # Control: the exit does look that name up when it is sent there.
    dns = world.dns_mark()
    world.run(["curl", "-sS", "--max-time", "20", "-x", f"socks5h://{SITE}:1080", f"http://{hidden}/"])
    assert hidden in world.dns_queries(dns)

    # The chosen path's secret is needed, and only then.
    work = world.workdir(user)
    r = world.vpnw(["run", "--config", str(site.config), "--via", "micro-auth", "--", "touch",
                    str(work / "ran")], user=user)
    assert r.returncode == 121, describe(r)
    assert f"the environment variable {PASSWORD_ENV} (password_env) is not set" in r.stderr
    assert not (work / "ran").exists()

"""Real clients through vpnw's doors, inside the test world, as root and as an
unprivileged user. Every client honours the proxy settings vpnw gives it; the
record must show each connection it made."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from ci_support import NODE_DIR, cannot, node_with_env_proxy
from e2e_support import assert_every_connection_accounted, connections, describe, opened, run_events
from progs_support import prog_text
from world import DEFAULT_NAMES, DEMO_PACKAGE, DEMO_VALUE, GIT_README, WORLD_V4

# The README's client table: curl, pip, git, Python's clients, Node.
pytestmark = [pytest.mark.world, pytest.mark.readme_table]
GITHUB = DEFAULT_NAMES["api.github.com"][0]


def whoami(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def assert_seen_from_world(seen: dict, host: str, tls: bool) -> None:
    # The server saw the connection come from the world: the broker dialled it.
    assert seen["peer"] == WORLD_V4 and seen["host"] == host and seen["tls"] is tls, seen


def test_curl_http_forward(world, user):
    r = world.vpnw(["run", "--", "curl", "-sS", "--max-time", "30", "http://api.github.com/whoami"], user=user)
    assert r.returncode == 0, describe(r)
    assert_seen_from_world(whoami(r.stdout), "api.github.com", tls=False)
    assert opened(run_events(r)) == [("api.github.com", 80, "http-forward")]


def test_curl_https_connect_verifies_the_server_end_to_end(world, user):
    r = world.vpnw(["run", "--", "curl", "-sS", "--max-time", "30", "--cacert", str(world.ca_pem),
                    "https://api.github.com/whoami"], user=user)
    assert r.returncode == 0, describe(r)
    seen = whoami(r.stdout)
    assert_seen_from_world(seen, "api.github.com", tls=True)
    assert seen["local"] == GITHUB
    events = run_events(r)
    assert opened(events) == [("api.github.com", 443, "http-connect")]
    opens = [e["fields"] for e in events if e["type"] == "conn.open"]
    assert opens[0]["address"] == GITHUB


def test_curl_socks5_hostname(world, user):
    r = world.vpnw(["run", "--", "curl", "-sS", "--max-time", "30", "--cacert", str(world.ca_pem),
                    "--socks5-hostname", "127.0.0.1:1080", "https://api.github.com/whoami"], user=user)
    assert r.returncode == 0, describe(r)
    assert_seen_from_world(whoami(r.stdout), "api.github.com", tls=True)
    assert opened(run_events(r)) == [("api.github.com", 443, "socks5")]


ONLY_ALL_PROXY = "unset HTTP_PROXY HTTPS_PROXY http_proxy https_proxy; "


def test_curl_uses_all_proxy_the_http_door(world, user):
    # With only ALL_PROXY to go by, curl tunnels through the HTTP door (the name travels).
    r = world.vpnw(["run", "--", "sh", "-c", ONLY_ALL_PROXY +
                    f"exec curl -sS --max-time 30 --cacert {world.ca_pem} https://api.github.com/whoami"],
                   user=user)
    assert r.returncode == 0, describe(r)
    assert_seen_from_world(whoami(r.stdout), "api.github.com", tls=True)
    assert opened(run_events(r)) == [("api.github.com", 443, "http-connect")]


def test_curl_tunnels_a_non_http_scheme_through_all_proxy(world, user):
    # A scheme curl cannot send as an HTTP request (telnet://, dict://, smtp://...)
    # goes through ALL_PROXY's HTTP door as a CONNECT tunnel to its port; here
    # telnet:// to the world's web server, which answers the GET sent over it.
    get = "GET /whoami HTTP/1.0\r\nHost: api.github.com\r\n\r\n"
    r = world.vpnw(["run", "--", "sh", "-c", ONLY_ALL_PROXY +
                    f"printf '{get}' | exec curl -sS --max-time 30 telnet://api.github.com:80"], user=user)
    assert r.returncode == 0, describe(r)
    assert_seen_from_world(whoami(r.stdout), "api.github.com", tls=False)
    assert opened(run_events(r)) == [("api.github.com", 80, "http-connect")]


URLLIB_PROGRAM = prog_text("urllib_client.py")


def test_python_urllib(world, user):
    program = world.file("urllib_client.py", URLLIB_PROGRAM)
    r = world.vpnw(["run", "--", sys.executable, str(program), str(world.ca_pem)], user=user)
    assert r.returncode == 0, describe(r)
    plain, tls = map(json.loads, r.stdout.splitlines())
    assert_seen_from_world(plain, "api.github.com", tls=False)
    assert_seen_from_world(tls, "api.github.com", tls=True)
    assert opened(run_events(r)) == [("api.github.com", 80, "http-forward"),
                                     ("api.github.com", 443, "http-connect")]


REQUESTS_PROGRAM = prog_text("requests_client.py")


def test_python_requests(world, user):
    program = world.file("requests_client.py", REQUESTS_PROGRAM)
    r = world.vpnw(["run", "--", sys.executable, str(program)], user=user,
                   env={"REQUESTS_CA_BUNDLE": str(world.ca_pem)})
    assert r.returncode == 0, describe(r)
    assert r.stdout.split() == ["api.github.com", "files.pythonhosted.org", "100000"]
    hosts = {(h, p) for h, p, _ in opened(run_events(r))}
    assert hosts == {("api.github.com", 443), ("files.pythonhosted.org", 443), ("pypi.world", 80)}


def test_pip_install_from_the_worlds_index(world, user):
    target = world.workdir(user)
    r = world.vpnw(["run", "--", sys.executable, "-m", "pip", "install", "--no-cache-dir",
                    "--index-url", "http://pypi.world/simple", "--trusted-host", "pypi.world", "--target", str(target / "site"),
                    DEMO_PACKAGE], user=user, timeout=120,
                   env={"PIP_CONFIG_FILE": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert r.returncode == 0, describe(r)
    installed = (target / "site" / DEMO_PACKAGE.replace("-", "_") / "__init__.py").read_text()
    assert DEMO_VALUE in installed
    assert {h for h, _, _ in opened(run_events(r))} == {"pypi.world"}


def test_git_clone_over_http(world, user):
    work = world.workdir(user)
    r = world.vpnw(["run", "--", "git", "clone", "-q", "http://git.world/repo.git", str(work / "repo")],
                   user=user, timeout=120)
    assert r.returncode == 0, describe(r)
    assert (work / "repo" / "README").read_text() == GIT_README
    assert {h for h, _, _ in opened(run_events(r))} == {"git.world"}


def test_node_fetch(world, user):
    node = node_with_env_proxy()
    if node is None:
        cannot(f"no node 22.21 or newer, which honours NODE_USE_ENV_PROXY (scripts/setup "
               f"installs one into {NODE_DIR})")
    script = ("fetch('https://api.github.com/whoami').then(r => r.text())"
              ".then(t => console.log(t.trim())).catch(e => { console.error(e); process.exit(3); })")
    r = world.vpnw(["run", "--", node, "-e", script], user=user,
                   env={"NODE_EXTRA_CA_CERTS": str(world.ca_pem)})
    assert r.returncode == 0, describe(r)
    assert_seen_from_world(whoami(r.stdout), "api.github.com", tls=True)
    assert opened(run_events(r)) == [("api.github.com", 443, "http-connect")]


# Node before 22.21 has no NODE_USE_ENV_PROXY, so this client reads the proxy
# from HTTPS_PROXY itself, as Node programs of that age do (with an agent), and
# speaks CONNECT and SOCKS5 (to the SOCKS door it is told of, SOCKS_DOOR) with
# Node's own http, net and tls.
NODE_DOORS = prog_text("node_doors.js")


def test_node_through_both_doors(world, user):
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        cannot("node is not installed here (scripts/setup installs Debian's nodejs)")
    script = world.file("node_doors.js", NODE_DOORS)
    r = world.vpnw(["run", "--", node, str(script)], user=user,
                   env={"CA": str(world.ca_pem), "SOCKS_DOOR": "socks5h://127.0.0.1:1080"})
    assert r.returncode == 0, describe(r)
    answers = json.loads(r.stdout.strip().splitlines()[-1])
    for answer in answers:
        assert answer.startswith("HTTP/1.1 200"), answer[:200]
        assert_seen_from_world(whoami(answer.split("\r\n\r\n", 1)[1]), "api.github.com", tls=True)
    assert opened(run_events(r)) == [("api.github.com", 443, "http-connect"),
                                     ("api.github.com", 443, "socks5")]


def test_trace_prints_and_records_every_connection(world, user):
    urls = ["http://api.github.com/whoami", "https://files.pythonhosted.org/whoami",
            "http://pypi.world/bytes/12345?seed=1", "https://git.world/whoami"]
    script = "; ".join(f"curl -sS --max-time 30 --cacert {world.ca_pem} -o /dev/null {u}" for u in urls)
    r = world.vpnw(["trace", "--", "sh", "-c", script], user=user)
    assert r.returncode == 0, describe(r)
    events = run_events(r)
    assert events[0]["fields"]["mode"] == "trace"
    by_conn = assert_every_connection_accounted(events)
    assert len(by_conn) == len(urls)
    assert [(h, p) for h, p, _ in opened(events)] == [
        ("api.github.com", 80), ("files.pythonhosted.org", 443), ("pypi.world", 80), ("git.world", 443)]
    # The download's bytes show up in its connection's close.
    pypi_conn = next(c for c, evs in by_conn.items() if evs[0]["fields"]["host"] == "pypi.world")
    close = next(e for e in by_conn[pypi_conn] if e["type"] == "conn.close")["fields"]
    assert close["bytes_down"] > 12345 and close["bytes_up"] > 0
    end = events[-1]["fields"]
    assert end["exit_code"] == 0 and end["connections"] == len(urls)
    # No URL path, query string or header is kept in the record.
    text = "".join(json.dumps(e) for e in events)
    assert "/whoami" not in text and "seed=" not in text and "/bytes" not in text
    # The human lines on stderr name each destination as it is requested.
    for host, port in [("api.github.com", 80), ("files.pythonhosted.org", 443),
                       ("pypi.world", 80), ("git.world", 443)]:
        assert re.search(rf"^vpnw .*#\d+ +→ {re.escape(host)}:{port} ", r.stderr, re.M), r.stderr


GUARD_POLICY = """version = 1
name = "agent"

[policy]
default = "deny"
deny_private = true
allow = ["api.github.com", "*.pythonhosted.org", "metadata.world", "sneaky.world"]
"""


def test_guard_denies_and_never_looks_up_a_denied_name(world, user, clean_dns):
    policy = world.file("agent.toml", GUARD_POLICY)
    # One public address and one private one: every address must pass.
    world.dns_set("sneaky.world", ["140.82.112.9", "10.1.2.3"])
    urls = ["https://api.github.com/whoami", "https://evil.example/whoami",
            "https://metadata.world/whoami", "https://sneaky.world/whoami",
            "https://files.pythonhosted.org/whoami"]
    script = "; ".join(f"curl -sS --max-time 30 --cacert {world.ca_pem} -o /dev/null "
                       f"-w '%{{http_code}}\\n' {u} || true" for u in urls)
    mark = world.dns_mark()
    r = world.vpnw(["guard", "--policy", str(policy), "--", "sh", "-c", script], user=user)
    assert r.returncode == 120, describe(r)
    codes = r.stdout.split()
    assert codes[0] == "200" and codes[4] == "200", codes
    assert all(c != "200" for c in codes[1:4]), codes
    looked_up = world.dns_queries(since=mark)
    assert "evil.example" not in looked_up  # denied under default deny: never asked
    assert {"api.github.com", "metadata.world", "sneaky.world"} <= set(looked_up)
    events = run_events(r)
    assert [(h, p) for h, p, _ in opened(events)] == [("api.github.com", 443),
                                                      ("files.pythonhosted.org", 443)]
    denied = {}
    for conn, evs in connections(events).items():
        for e in evs:
            if e["type"] == "policy.deny":
                denied[evs[0]["fields"]["host"]] = e["fields"]["rule"]
    assert set(denied) == {"evil.example", "metadata.world", "sneaky.world"}
    assert denied["metadata.world"] == denied["sneaky.world"] == "deny_private"
    assert events[-1]["fields"]["denied"] == 3
    # Nothing denied reached the internet: the web server never saw those names.
    log = "\n".join(world.web_log())
    assert "evil.example" not in log

"""The test world itself works, and holds: nothing in it reaches the host."""
from __future__ import annotations

import json

import pytest

from world import DEFAULT_NAMES, DEMO_PACKAGE, GIT_README, INTERNET_V4, WORLD_V4, WORLD_V6, payload_sha256

pytestmark = pytest.mark.world


def curl(world, *args, user="root"):
    return world.run(["curl", "-sS", "--max-time", "20", "--cacert", str(world.ca_pem), *args], user=user)


def test_https_reaches_a_fake_host_and_sees_the_world(world, user):
    r = curl(world, "https://api.github.com/whoami", user=user)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen == {**seen, "peer": WORLD_V4, "local": DEFAULT_NAMES["api.github.com"][0],
                    "local_port": 443, "host": "api.github.com", "tls": True}


def test_the_certificate_is_checked(world):
    # Without the test CA, curl must refuse: the world's TLS is real.
    r = world.run(["curl", "-sS", "--max-time", "20", "https://api.github.com/whoami"])
    assert r.returncode == 60, (r.returncode, r.stderr)


def test_any_address_answers_ipv4_and_ipv6(world):
    r = curl(world, "http://192.0.2.77:8080/whoami")
    assert json.loads(r.stdout)["local"] == "192.0.2.77"
    r = curl(world, "http://[2606:50c0:8000::154]/whoami")
    seen = json.loads(r.stdout)
    assert (seen["peer"], seen["local"]) == (WORLD_V6, "2606:50c0:8000::154")


def test_downloads_and_uploads_are_exact(world):
    r = world.run(["sh", "-c", "curl -sS http://pypi.world/bytes/300001?seed=7 | sha256sum"])
    assert r.stdout.split()[0] == payload_sha256(300001, 7)
    upload = world.file("upload.bin", b"x" * 100000)
    r = curl(world, "--data-binary", f"@{upload}", "http://pypi.world/upload")
    assert json.loads(r.stdout)["length"] == 100000


def test_dns_log_records_queries_and_answers_can_change(world, clean_dns):
    mark = world.dns_mark()
    r = world.run(["getent", "ahostsv4", "git.world"])
    assert DEFAULT_NAMES["git.world"][0] in r.stdout
    assert "git.world" in world.dns_queries(since=mark)
    world.dns_set("git.world", ["140.82.113.99"])
    r = world.run(["getent", "ahostsv4", "git.world"])
    assert "140.82.113.99" in r.stdout and DEFAULT_NAMES["git.world"][0] not in r.stdout
    world.dns_set("git.world", [])
    assert world.run(["getent", "ahostsv4", "git.world"]).returncode != 0


def test_a_name_not_asked_for_is_not_in_the_log(world):
    mark = world.dns_mark()
    world.run(["getent", "ahostsv4", "api.github.com"])
    queries = world.dns_queries(since=mark)
    assert "api.github.com" in queries and "evil.example" not in queries


def test_unknown_names_fail_here_and_go_nowhere(world):
    r = world.run(["getent", "hosts", "no-such-name.example"])
    assert r.returncode == 2


def test_the_world_routes_only_to_its_veth(world):
    links = world.run(["ip", "-o", "link"]).stdout.splitlines()
    assert [line.split(":")[1].strip().split("@")[0] for line in links] == ["lo", "vw0"]
    for family in ("-4", "-6"):
        for table in ("main", "local", "all"):
            routes = world.run(["ip", family, "route", "show", "table", table]).stdout
            for line in routes.splitlines():
                assert " dev vw0" in line or " dev lo" in line, line
    assert world.run(["ip", "-4", "route"]).stdout.startswith(f"default via {INTERNET_V4} dev vw0")


def test_world_etc_files_are_ours(world):
    assert world.run(["cat", "/etc/resolv.conf"]).stdout.strip() == "nameserver 10.53.0.53"
    hosts = world.run(["cat", "/etc/hosts"]).stdout
    assert "localhost" in hosts and "github" not in hosts


def test_package_index_and_git_are_served(world):
    r = curl(world, f"http://pypi.world/simple/{DEMO_PACKAGE}/")
    assert ".whl#sha256=" in r.stdout
    work = world.workdir()
    r = world.run(["git", "clone", "-q", "http://git.world/repo.git", str(work / "repo")])
    assert r.returncode == 0, r.stderr
    assert (work / "repo" / "README").read_text() == GIT_README


def test_the_unprivileged_user_is_who_runs(world, user):
    r = world.run(["id", "-un"], user=user)
    assert r.stdout.strip() == user
    assert world.run(["sh", "-c", 'touch "$XDG_STATE_HOME/x"'], user=user).returncode == 0


def test_binds_are_for_the_command_alone(world, user):
    """world.run(binds=...) mounts over a path for that command alone: the
    next command, and the world's mount table, never see it (tests that
    mounted over the passwd homes in the world itself leaked into each other
    under pytest-xdist)."""
    import pwd
    theirs = world.workdir(user)
    (theirs / "mark").write_text("bound\n")
    (theirs / "mark").chmod(0o644)
    home = pwd.getpwnam(user).pw_dir
    before = world.in_world("cat", "/proc/self/mountinfo").stdout
    bound = world.run(["cat", f"{home}/mark"], user=user, binds={home: str(theirs)})
    assert bound.returncode == 0 and bound.stdout == "bound\n", (bound.stdout, bound.stderr)
    after = world.run(["cat", f"{home}/mark"], user=user)
    assert after.returncode != 0 and "No such file" in after.stderr, (after.stdout, after.stderr)
    assert world.in_world("cat", "/proc/self/mountinfo").stdout == before

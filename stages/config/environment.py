"""The environment variables vpnw itself reads, checked like its options.

Pure: each reader takes the environment as a dict and returns the setting or
raises `EnvironmentProblem`, whose message names the variable, the value and
the fix. The command line checks them all before anything starts (exit 121);
the stage that uses a setting reads it through the same function, so what
was checked is what is used. An empty value counts as unset.
"""
from __future__ import annotations

import math

WG_HANDSHAKE_TIMEOUT = "VPNW_WG_HANDSHAKE_TIMEOUT"
BROKER_WORKERS = "VPNW_BROKER_WORKERS"
STATE_HOME = "XDG_STATE_HOME"

DEFAULT_HANDSHAKE_SECONDS = 8.0
MAX_HANDSHAKE_SECONDS = 3600.0


class EnvironmentProblem(ValueError):
    """A variable vpnw reads holds a value it cannot use."""


def _problem(name: str, value: str, what: str, fix: str) -> EnvironmentProblem:
    return EnvironmentProblem(f"{name}={value!r}: {what}; fix: {fix} (or unset {name})")


def handshake_timeout(env: dict) -> float:
    """Seconds the WireGuard path waits for its first handshake."""
    value = env.get(WG_HANDSHAKE_TIMEOUT, "")
    if value == "":
        return DEFAULT_HANDSHAKE_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds <= MAX_HANDSHAKE_SECONDS):
        what = (f"more than the longest wait, {MAX_HANDSHAKE_SECONDS:.0f} seconds"
                if seconds > MAX_HANDSHAKE_SECONDS else "not a number of seconds above 0")
        raise _problem(WG_HANDSHAKE_TIMEOUT, value, what,
                       f"give seconds from 0.1 to {MAX_HANDSHAKE_SECONDS:.0f}, e.g. "
                       f"{WG_HANDSHAKE_TIMEOUT}=20")
    return seconds


def broker_workers(env: dict) -> int | None:
    """The broker's process count when the user sets one; None: vpnw chooses."""
    value = env.get(BROKER_WORKERS, "")
    if value == "":
        return None
    if not (value.isascii() and value.isdigit() and int(value) > 0):
        raise _problem(BROKER_WORKERS, value, "not a whole number above 0",
                       f"give a count, e.g. {BROKER_WORKERS}=2")
    return int(value)


def state_home(env: dict) -> str | None:
    """$XDG_STATE_HOME when set (the XDG spec allows only absolute paths)."""
    value = env.get(STATE_HOME, "")
    if value == "":
        return None
    if not value.startswith("/"):
        raise _problem(STATE_HOME, value, "not an absolute path (the XDG spec allows no other)",
                       f"give a path from /, e.g. {STATE_HOME}=$HOME/.local/state")
    return value


READERS = (handshake_timeout, broker_workers, state_home)


def check(env: dict) -> str | None:
    """The first problem with what vpnw reads from `env`, or None."""
    for reader in READERS:
        try:
            reader(env)
        except EnvironmentProblem as exc:
            return str(exc)
    return None

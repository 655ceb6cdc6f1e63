"""Shared fixtures. The test world (tests/world.py) is built once per pytest
worker, only when a test asks for it.

The world needs root: without it every test that uses the world is skipped,
saying so. The unprivileged variant of `user` needs the account `vpnwtest`
(scripts/test creates it); without it that variant is skipped, saying so.
"""
from __future__ import annotations

import os
import shutil

import pytest

# In CI a missing world is a failure, not a skip: the end-to-end tests are the point.
from ci_support import cannot as _cannot
# ci_support's hooks: the readme_table marker, whose skips fail under CI; the
# needs marker, a missing tool that fails under CI; the slow tests' time limit.
from ci_support import (pytest_collection_modifyitems, pytest_configure,  # noqa: F401
                        pytest_runtest_makereport, pytest_runtest_setup)
from world import UNPRIVILEGED_USER, World, WorldError, user_exists


@pytest.fixture(scope="session")
def world():
    if os.geteuid() != 0:
        _cannot("the test world needs root (network namespaces, a second user): "
                    "run scripts/test as root")
    missing = [t for t in ("unshare", "nsenter", "ip", "setpriv", "dnsmasq", "git", "curl")
               if shutil.which(t) is None]
    if missing:
        _cannot(f"the test world needs {', '.join(missing)} (scripts/test installs them)")
    w = World()
    try:
        w.start()
    except WorldError as exc:
        _cannot(f"the test world cannot be built here: {exc}")
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture(params=["root", UNPRIVILEGED_USER])
def user(request) -> str:
    """End-to-end tests run once as root and once as an unprivileged user."""
    if request.param != "root" and not user_exists(request.param):
        _cannot(f"no user {request.param!r}: scripts/test creates it (useradd -m {request.param})")
    return request.param


@pytest.fixture
def clean_dns(world):
    """Restore the world's default DNS table after a test changes it."""
    yield world
    world.dns_reset()


@pytest.fixture
def term(world, user, tmp_path):
    """A tmux pane with an interactive bash in the test world, as `user`, in a
    fresh work directory of that user's (tests/tmux_support.py); closed after."""
    from tmux_support import world_shell
    screen = world_shell(world, user, tmp_path)
    try:
        yield screen
    finally:
        screen.close()


@pytest.fixture
def origins_on_loopback(monkeypatch):
    """The broker's own tests serve their origins on this machine's loopback,
    which vpnw never dials (decide.py step 4, "the machine itself"): this
    leaves step 4 out of the brokers such a test starts in this process.
    A broker in a child process takes broker_support.BROKER_REACHING_LOOPBACK."""
    from stages.broker import connector
    monkeypatch.setattr(connector, "MACHINE_STEP", False)


"""What a test does when something it needs is missing here: skip, saying
why; under CI (CI set) fail instead, since scripts/setup installs it there
and a skip would let the suite pass without the test.

Also a pytest plugin (tests/conftest.py takes its hooks): a test marked
`readme_table` is one the README's tables rely on (an agent, a client in
the table). Under CI such a test never skips, however it was skipped
(`cannot`, `pytest.skip`, `skipif`, a fixture): the skip is reported as a
failure, so CI cannot pass with the table untested.

`needs(missing, reason)` is the mark to use in place of `skipif` for a tool
scripts/setup installs (it goes through `cannot`, so under CI it fails), and
every test has a time limit (pytest-timeout, pyproject.toml's `timeout`): a
test marked `slow` gets SLOW_TIMEOUT unless it sets its own."""
from __future__ import annotations

import os

import pytest

README_TABLE = "readme_table"


def under_ci() -> bool:
    """CI=true (GitHub, GitLab, this project's .ci/run); CI=false or CI=0 is not CI."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def cannot(reason: str):
    if under_ci():
        pytest.fail(f"{reason} (CI: scripts/setup should have installed it)")
    pytest.skip(reason)


NEEDS = "needs"
# A slow test's limit: the load tests run minutes under load (their own
# subprocess limits go to 600 s).
SLOW_TIMEOUT = 900


def needs(missing: bool, reason: str):
    """A mark: the test needs something scripts/setup installs. When `missing`,
    it skips saying `reason` (outside CI) or fails (under CI), before it runs."""
    return pytest.mark.needs(missing=bool(missing), reason=reason)


def pytest_configure(config):
    config.addinivalue_line("markers", f"{README_TABLE}: a test the README's tables rely on "
                            "(an agent, a client); under CI its skip is a failure")
    config.addinivalue_line("markers", f"{NEEDS}(missing, reason): the test needs a tool scripts/setup "
                            "installs; skipped when it is missing, a failure under CI")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


def pytest_runtest_setup(item):
    for mark in item.iter_markers(NEEDS):
        if mark.kwargs["missing"]:
            cannot(mark.kwargs["reason"])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and not hasattr(report, "wasxfail") and under_ci()
            and item.get_closest_marker(README_TABLE) is not None):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI, but the README's tables rely on this test: {reason} "
                           "(scripts/setup should have installed what it needs)")


# scripts/setup puts Node's own build (the npm registry's node-linux-<arch>)
# here when the machine's node is older than 22.21 (VPNW_NODE moves it).
NODE_DIR = os.environ.get("VPNW_NODE", "/opt/vpnw-node")


def node_with_env_proxy() -> str | None:
    """A node that honours NODE_USE_ENV_PROXY (22.21 or newer): the one
    scripts/setup installed, else the machine's own if it is new enough."""
    import glob
    import shutil
    import subprocess

    from stages.orchestrator.doctor import node_honours_env_proxy
    for node in (*sorted(glob.glob(f"{NODE_DIR}/node_modules/node-linux-*/bin/node")),
                 shutil.which("node"), shutil.which("nodejs")):
        if node and os.access(node, os.X_OK):
            version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout
            if node_honours_env_proxy(version):
                return node
    return None

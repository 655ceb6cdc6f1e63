"""What a test does when something it needs is missing here: skip, saying
why; under CI (CI set) fail instead, since scripts/setup installs it there
and a skip would let the suite pass without the test."""
from __future__ import annotations

import os

import pytest


def cannot(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI: scripts/setup should have installed it)")
    pytest.skip(reason)


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

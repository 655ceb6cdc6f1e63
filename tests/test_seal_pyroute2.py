"""An independent look at the seal: pyroute2, a netlink library we did not
write, lists the sandbox's links and routes from inside and tries to change
them. The helper checks the same things with its own small rtnetlink code
(pyroute2 costs ~220 ms to import, too much for every run), so this is the
second opinion."""
from __future__ import annotations

import json
import sys

import pytest

from progs_support import prog_text

PROBE = prog_text("pyroute2_probe.py")


@pytest.mark.world
def test_pyroute2_sees_only_loopback_and_cannot_change_it(world, user):
    probe = world.file("pyroute2_probe.py", PROBE)
    result = world.vpnw(["run", "--", sys.executable, str(probe)], user=user)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["links"] == ["lo"] and seen["up"] == ["lo"]
    # The main tables are empty: loopback's own routes live in the local table.
    assert seen["main_routes"] == [] or all(dst in ("::1",) for _f, dst, _l in seen["main_routes"]), seen
    # EPERM (1) for every change: the program has no capabilities left.
    assert seen["attempts"] == {"add veth": 1, "add address": 1, "add route": 1}, seen

    # Control: the same look outside the sandbox, in the world, sees the world's veth
    # and its routes (no changes tried there: the world is shared by other tests).
    control = world.run([sys.executable, str(probe), "--look-only"], user=user)
    assert control.returncode == 0, control.stderr
    outside = json.loads(control.stdout.strip().splitlines()[-1])
    assert len(outside["links"]) > 1 and outside["main_routes"], outside

"""Every socket family the kernel knows (0 .. AF_MAX = 46), one test each,
created inside the sandbox with every socket type: only AF_INET, AF_INET6 and
AF_NETLINK may be created; every other family gets EAFNOSUPPORT from the
filter, whatever the type, whether or not this kernel has the family (no
control: the filter's answer must not depend on it). Plus the same AF_UNIX
with high bits set (the kernel reads an int)."""
from __future__ import annotations

import pytest

from bypass_bench import errnos

pytestmark = pytest.mark.world

AF_MAX = 46
ALLOWED = {2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK"}
FAMILIES = [str(n) for n in range(AF_MAX + 1)] + [hex(0x1_00000001)]
PLAN = [{"id": f"family-{f}", "attempt": "socket_family", "args": [int(f, 0)]} for f in FAMILIES]


@pytest.mark.parametrize("family", FAMILIES)
def test_only_inet_inet6_and_netlink_sockets_can_be_made(bench, user, family):
    results, _ = bench.inside("families", user, PLAN)
    res = results[f"family-{family}"]
    if int(family, 0) in ALLOWED:
        assert res["ok"], f"{ALLOWED[int(family, 0)]} must stay usable: {res}"
    else:
        assert not res["ok"], f"a way out: socket family {family} was created inside: {res}"
        assert errnos(res) == {"EAFNOSUPPORT"}, res

"""Every socket family the kernel knows (0 .. AF_MAX = 46), one test each,
created inside the sandbox with every socket type: only AF_INET, AF_INET6,
AF_NETLINK and AF_UNIX may be created (AF_UNIX: stream and seqpacket only,
each connect() answered by the supervisor, tests/bypass/test_unix_origin.py);
every other family gets EAFNOSUPPORT from the filter, whatever the type,
whether or not this kernel has the family (no control: the filter's answer
must not depend on it). Plus AF_UNIX with high bits set (the kernel reads an
int, and so does the filter: it is AF_UNIX)."""
from __future__ import annotations

import pytest

from bypass_bench import errnos

pytestmark = pytest.mark.world

AF_MAX = 46
ALLOWED = {1: "AF_UNIX", 2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK"}
FAMILIES = [str(n) for n in range(AF_MAX + 1)] + [hex(0x1_00000001)]
PLAN = [{"id": f"family-{f}", "attempt": "socket_family", "args": [int(f, 0)]} for f in FAMILIES]


@pytest.mark.parametrize("family", FAMILIES)
def test_only_inet_inet6_netlink_and_unix_sockets_can_be_made(bench, user, family):
    results, _ = bench.inside("families", user, PLAN)
    res = results[f"family-{family}"]
    if int(family, 0) & 0xFFFFFFFF in ALLOWED:
        assert res["ok"], f"{ALLOWED[int(family, 0) & 0xFFFFFFFF]} must stay usable: {res}"
    else:
        assert not res["ok"], f"a way out: socket family {family} was created inside: {res}"
        assert errnos(res) == {"EAFNOSUPPORT"}, res

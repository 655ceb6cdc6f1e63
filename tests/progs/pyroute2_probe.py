
import json
import sys
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
out = {}
with IPRoute() as ipr:
    out["links"] = sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links())
    out["up"] = sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links() if link["flags"] & 1)
    routes = []
    for family in (2, 10):
        for r in ipr.get_routes(family=family, table=254):
            routes.append((family, r.get_attr("RTA_DST"), r["dst_len"]))
    out["main_routes"] = routes
    attempts = {}
    changes = () if "--look-only" in sys.argv else (
        ("add veth", lambda: ipr.link("add", ifname="vx0", kind="veth", peer="vx1")),
        ("add address", lambda: ipr.addr("add", index=1, address="10.9.9.9", mask=24)),
        ("add route", lambda: ipr.route("add", dst="0.0.0.0/0", oif=1)),
    )
    for name, call in changes:
        try:
            call()
            attempts[name] = "succeeded"
        except NetlinkError as e:
            attempts[name] = e.code
    out["attempts"] = attempts
print(json.dumps(out))

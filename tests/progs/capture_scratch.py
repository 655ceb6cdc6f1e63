"""Run by tests/test_capture.py in namespaces of its own (unshare -Urn):
capture installed, then the seal's check of it before and after an
intruder's nftables table. One JSON line."""
import json
from stages.helper import capture, netlink
netlink.bring_up("lo")
capture.install(1081, 53)
links, routes = netlink.read_links_and_routes()
before = netlink.seal_problems(links, routes, capture=True)
nft = capture.Nftables()
nft.run("add table ip intruder")
after = capture.ruleset_problems(json.loads(nft.run("list ruleset", as_json=True)), 1081, 53)
print(json.dumps({"before": before, "after": after}))

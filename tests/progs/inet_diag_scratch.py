"""Run by tests/test_capture.py in a scratch network namespace (unshare
-Urn): listeners on 127.0.0.1, ::1, 0.0.0.0, :: and 127.0.0.2, then what
loopback_listener says of each port and of a closed one. One JSON line."""
import json
import socket
from stages.kernel.inet_diag import loopback_listener
from stages.helper import netlink
netlink.bring_up("lo")
held = []
for family, address, port in ((socket.AF_INET, "127.0.0.1", 18001), (socket.AF_INET6, "::1", 18002),
                              (socket.AF_INET, "0.0.0.0", 18003), (socket.AF_INET6, "::", 18004),
                              (socket.AF_INET, "127.0.0.2", 18005)):
    s = socket.socket(family)
    s.bind((address, port))
    s.listen()
    held.append(s)
print(json.dumps({p: loopback_listener(p) for p in range(18001, 18007)}))

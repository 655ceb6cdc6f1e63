"""Listeners the bypass tests aim at, outside the sandbox:
`bypass_targets.py [--tcp PORT] [--udp PORT] [--unix PATH] [--abstract NAME] [--banner TEXT]`.

TCP and Unix listeners send one line (the banner, "world" by default) to
whoever connects; the UDP listener echoes. IPv4 and IPv6 on one dual-stack
socket each. Prints "ready" once every listener is bound.
"""
import argparse
import os
import selectors
import socket

parser = argparse.ArgumentParser()
parser.add_argument("--tcp", type=int, action="append", default=[])
parser.add_argument("--udp", type=int, action="append", default=[])
parser.add_argument("--unix", action="append", default=[])
parser.add_argument("--abstract", action="append", default=[])
parser.add_argument("--banner", default="world")
opts = parser.parse_args()
banner = (opts.banner + "\n").encode()

sel = selectors.DefaultSelector()
for port in opts.tcp:
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::", port))
    s.listen(64)
    sel.register(s, selectors.EVENT_READ, "accept")
for port in opts.udp:
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port))
    sel.register(s, selectors.EVENT_READ, "echo")
for path in opts.unix:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, 0o777)
    s.listen(64)
    sel.register(s, selectors.EVENT_READ, "accept")
for name in opts.abstract:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\0" + name)
    s.listen(64)
    sel.register(s, selectors.EVENT_READ, "accept")
print("ready", flush=True)

while True:
    for key, _ in sel.select():
        try:
            if key.data == "accept":
                conn, _ = key.fileobj.accept()
                conn.sendall(banner)
                conn.close()
            else:
                data, peer = key.fileobj.recvfrom(65536)
                key.fileobj.sendto(data, peer)
        except OSError:
            pass

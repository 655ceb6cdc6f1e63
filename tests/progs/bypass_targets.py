"""Listeners the bypass tests aim at, outside the sandbox:
`bypass_targets.py [--tcp PORT] [--udp PORT] [--unix PATH] [--abstract NAME]
[--unix-seqpacket PATH] [--unix-dgram PATH] [--abstract-dgram NAME]
[--received DIR] [--banner TEXT]`.

TCP and Unix stream/seqpacket listeners send one line (the banner, "world" by
default) to whoever connects; the UDP listener echoes. IPv4 and IPv6 on one
dual-stack socket each. A Unix datagram socket (what journald, syslog and
notify sockets are) writes each message it gets to DIR/<message>, holding
"fds=<n>" (descriptors that came with it over SCM_RIGHTS): the proof a probe
reads that a message reached it. Prints "ready" once every listener is bound.
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
parser.add_argument("--unix-seqpacket", action="append", default=[])
parser.add_argument("--unix-dgram", action="append", default=[])
parser.add_argument("--abstract-dgram", action="append", default=[])
parser.add_argument("--received")
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
for path in opts.unix_seqpacket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)
    os.chmod(path, 0o777)
    s.listen(64)
    sel.register(s, selectors.EVENT_READ, "accept")
for name in opts.unix_dgram + ["\0" + n for n in opts.abstract_dgram]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(name)
    if not name.startswith("\0"):
        os.chmod(name, 0o777)
    sel.register(s, selectors.EVENT_READ, "log")
print("ready", flush=True)


def log_message(sock):
    data, ancdata, _flags, _peer = sock.recvmsg(65536, socket.CMSG_SPACE(64 * 4))
    fds = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i:i + 4], "little") for i in range(0, len(payload) - 3, 4)]
    for fd in fds:
        os.close(fd)
    name = data.decode(errors="replace")
    if opts.received and name.isalnum():
        tmp = os.path.join(opts.received, "." + name)
        with open(tmp, "w") as f:
            f.write(f"fds={len(fds)}\n")
        os.rename(tmp, os.path.join(opts.received, name))


while True:
    for key, _ in sel.select():
        try:
            if key.data == "log":
                log_message(key.fileobj)
            elif key.data == "accept":
                conn, _ = key.fileobj.accept()
                conn.sendall(banner)
                conn.close()
            else:
                data, peer = key.fileobj.recvfrom(65536)
                key.fileobj.sendto(data, peer)
        except OSError:
            pass

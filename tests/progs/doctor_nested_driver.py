
import http.server
import json
import os
import subprocess
import sys
import threading
vpnw, own_net = sys.argv[1], sys.argv[2] == "own-net"
if own_net:
    # A network of its own, like a container's: only loopback, brought up here,
    # and the destination is a server on it.
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            body = b"nested-ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    # The server listens on an address of this namespace's own, which vpnw
    # dials only under a rule naming it (its own loopback never: issue 44).
    own = "198.51.100.7"
    subprocess.run(["ip", "addr", "add", f"{own}/32", "dev", "lo"], check=True)
    server = http.server.ThreadingHTTPServer((own, 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://{own}:{server.server_address[1]}/"
    client = ["curl", "-sS", "--max-time", "20", "-x", "http://127.0.0.1:3128", url]
    policy = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"nested-{os.getpid()}.toml")
    with open(policy, "w") as f:
        f.write(f'version = 1\n[policy]\nallow = ["{own}"]\n')
    how = ["guard", "--policy", policy]
else:
    url = "http://api.github.com/whoami"
    client = ["curl", "-sS", "--max-time", "20", url]
    how = ["run"]
r = subprocess.run([vpnw, *how, "--", *client], capture_output=True, text=True, timeout=120)
print(json.dumps({"code": r.returncode, "out": r.stdout, "err": r.stderr,
                  "uid": os.getuid(), "userns": os.readlink("/proc/self/ns/user")}))

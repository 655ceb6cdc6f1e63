
import http.server, json, os, subprocess, sys, threading
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
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    client = ["env", "-u", "NO_PROXY", "-u", "no_proxy", "curl", "-sS", "--max-time", "20",
              "-x", "http://127.0.0.1:3128", url]
else:
    url = "http://api.github.com/whoami"
    client = ["curl", "-sS", "--max-time", "20", url]
r = subprocess.run([vpnw, "run", "--", *client], capture_output=True, text=True, timeout=120)
print(json.dumps({"code": r.returncode, "out": r.stdout, "err": r.stderr,
                  "uid": os.getuid(), "userns": os.readlink("/proc/self/ns/user")}))

"""The web of the test world: one program serving HTTP and HTTPS on every
address of the internet namespace (it answers for any address at all).

    python http_server.py --docroot DIR --http 80,8080 --https 443 \
        --cert server.pem --key server.key --log access.log

Routes:
  GET  /bytes/<n>?seed=s   n deterministic bytes (content.py)
  POST /upload             {"sha256": ..., "length": ...} of the request body
                           (Content-Length or chunked)
  GET  /whoami             {"peer": ..., "port": ..., "local": ..., "host": ..., "tls": ...}
  GET  anything else       static files under --docroot (PyPI simple index,
                           wheels, a git repository for the dumb protocol)
  POST <path>              a stand-in API's answer, when --docroot has
                           <path>.answer.json: {"status": N, "json": {...}}
                           (the agents' API hosts, tests/agents_support.py)
"""
from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import signal
import socket
import ssl
import sys
import threading
import urllib.parse
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from content import payload_chunks  # noqa: E402

MAX_DOWNLOAD = 1 << 31
CHUNK_SIZES = (1, 4096, 32 * 1024, 65537, 1 << 20, 7)   # chunked answers cut here, in turn
_log_lock = threading.Lock()
_log_file = None


def plain_address(addr: str) -> str:
    # A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d.
    ip = ipaddress.ip_address(addr.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    return str(ip)


class WorldHandler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "world/1"

    def log_message(self, format, *args):  # noqa: A002 - base class name
        if _log_file is not None:
            with _log_lock:
                _log_file.write(f"{plain_address(self.client_address[0])} {format % args}\n")
                _log_file.flush()

    def _send_json(self, obj, status=200):
        body = json.dumps(obj).encode() + b"\n"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _route(self):
        url = urllib.parse.urlsplit(self.path)
        return url.path, urllib.parse.parse_qs(url.query)

    def do_GET(self):
        path, query = self._route()
        if path == "/whoami":
            local = self.connection.getsockname()
            return self._send_json({
                "peer": plain_address(self.client_address[0]),
                "port": self.client_address[1],
                "local": plain_address(local[0]),
                "local_port": local[1],
                "host": self.headers.get("Host"),
                "tls": isinstance(self.connection, ssl.SSLSocket),
            })
        if path.startswith("/bytes/"):
            try:
                size = int(path[len("/bytes/"):])
            except ValueError:
                return self.send_error(400, "size must be an integer")
            if not 0 <= size <= MAX_DOWNLOAD:
                return self.send_error(400, "size out of range")
            seed = query.get("seed", ["0"])[0]
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if self.command != "HEAD":
                for chunk in payload_chunks(size, seed):
                    self.wfile.write(chunk)
            return None
        if path.startswith("/chunked/"):
            # The same bytes as /bytes/, chunked: chunk sizes cycle through
            # ones below and above the broker's splice threshold, and the
            # chunk extension and trailer a parser must step over.
            try:
                size = int(path[len("/chunked/"):])
            except ValueError:
                return self.send_error(400, "size must be an integer")
            if not 0 <= size <= MAX_DOWNLOAD:
                return self.send_error(400, "size out of range")
            seed = query.get("seed", ["0"])[0]
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if self.command == "HEAD":
                return None
            cuts = CHUNK_SIZES
            n = 0
            for piece in payload_chunks(size, seed):
                view = memoryview(piece)
                while view:
                    take = cuts[n % len(cuts)]
                    n += 1
                    self.wfile.write(b"%x;ext=1\r\n" % len(view[:take]))
                    self.wfile.write(view[:take])
                    self.wfile.write(b"\r\n")
                    view = view[take:]
            self.wfile.write(b"0\r\nX-Trailer: yes\r\n\r\n")
            return None
        return super().do_GET()

    def do_HEAD(self):
        return self.do_GET()

    def _read_body(self):
        digest, length = hashlib.sha256(), 0
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                line = self.rfile.readline(1024)
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                left = size
                while left:
                    data = self.rfile.read(min(left, 1 << 20))
                    if not data:
                        raise ConnectionError("body cut short")
                    digest.update(data)
                    length += len(data)
                    left -= len(data)
                self.rfile.readline(16)
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left:
                data = self.rfile.read(min(left, 1 << 20))
                if not data:
                    raise ConnectionError("body cut short")
                digest.update(data)
                length += len(data)
                left -= len(data)
        return digest.hexdigest(), length

    def _stand_in_answer(self, path: str):
        """What a stand-in API answers a POST to `path`, if the docroot says."""
        answer = os.path.join(self.directory, path.lstrip("/") + ".answer.json")
        if ".." in path.split("/") or not os.path.isfile(answer):
            return None
        with open(answer, encoding="utf-8") as f:
            return json.load(f)

    def do_POST(self):
        path, _ = self._route()
        answer = self._stand_in_answer(path)
        if answer is not None:
            self._read_body()
            return self._send_json(answer["json"], status=answer["status"])
        if path != "/upload":
            # Drain the body so the connection can be reused.
            self._read_body()
            return self.send_error(404)
        sha, length = self._read_body()
        return self._send_json({"sha256": sha, "length": length})

    do_PUT = do_POST


class DualStackServer(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True
    request_queue_size = 128
    tls_context: ssl.SSLContext | None = None

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def finish_request(self, request, client_address):
        # The TLS handshake happens here, in the connection's own thread, so a
        # slow client never holds up accept().
        if self.tls_context is not None:
            request.settimeout(30)
            try:
                request = self.tls_context.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                return
            request.settimeout(None)
        super().finish_request(request, client_address)


def main(argv=None) -> int:
    global _log_file
    parser = argparse.ArgumentParser()
    parser.add_argument("--docroot", required=True)
    parser.add_argument("--http", default="80")
    parser.add_argument("--https", default="")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--log")
    parser.add_argument("--ready-fd", type=int)
    args = parser.parse_args(argv)
    if args.log:
        _log_file = open(args.log, "a", buffering=1)
    handler = partial(WorldHandler, directory=args.docroot)
    servers = []
    for port in filter(None, args.http.split(",")):
        servers.append(DualStackServer(("::", int(port)), handler))
    if args.https:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(args.cert, args.key)
        for port in filter(None, args.https.split(",")):
            server = DualStackServer(("::", int(port)), handler)
            server.tls_context = ctx
            servers.append(server)
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    if args.ready_fd is not None:
        os.write(args.ready_fd, b"ready\n")
        os.close(args.ready_fd)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    sys.exit(main())

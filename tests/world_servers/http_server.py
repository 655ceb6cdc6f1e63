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

On the model hosts (content.MODEL_HOSTS), /v1/... without such an answer is
a stand-in model API that requires the real key (content.OPENAI_REAL_KEY,
ANTHROPIC_REAL_KEY): GET /v1/models, POST /v1/chat/completions and
/v1/messages (plain, or SSE with "stream": true), GET /v1/echo (what the
host received: header names, Host, the path, whether the key was right;
never a header's value), POST /v1/upload, GET /v1/bytes/<n>, GET
/v1/realtime (a WebSocket upgrade, then every byte echoed). On github.com,
/private/repo.git/... is the world's repository behind HTTP Basic with
content.GIT_REAL_TOKEN as the password. POST /collect appends its body to
collected.log beside --log (what a program exfiltrated).
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
from content import (ANTHROPIC_REAL_KEY, GIT_REAL_TOKEN, MODEL_ANSWER, MODEL_HOSTS,  # noqa: E402
                     OPENAI_REAL_KEY, payload_chunks)

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
    # A head and its body are two writes: without TCP_NODELAY the body waits
    # for the client's delayed ACK (40 ms a request on a kept-alive connection).
    disable_nagle_algorithm = True

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

    # ── the stand-in model APIs (content.MODEL_HOSTS) ──────────────────────
    def _model_api(self):
        """'openai' / 'anthropic' when this request is for a stand-in model API."""
        host = (self.headers.get("Host") or "").split(":")[0].lower()
        path, _ = self._route()
        if host not in MODEL_HOSTS or not path.startswith("/v1/"):
            return None
        if self.command == "POST" and self._stand_in_answer(path) is not None:
            return None
        return MODEL_HOSTS[host]

    def _key_is_right(self, api: str) -> str:
        if api == "openai":
            got = self.headers.get_all("Authorization") or []
            return "ok" if got == [f"Bearer {OPENAI_REAL_KEY}"] else ("missing" if not got else "wrong")
        got = self.headers.get_all("x-api-key") or []
        return "ok" if got == [ANTHROPIC_REAL_KEY] else ("missing" if not got else "wrong")

    def _model(self, api: str):
        path, query = self._route()
        auth = self._key_is_right(api)
        if path == "/v1/echo":
            self._drain_body()
            return self._send_json({"auth": auth, "host": self.headers.get("Host"), "path": self.path,
                                    "method": self.command,
                                    "headers": sorted(k.lower() for k in self.headers.keys())})
        if auth != "ok":
            self._drain_body()
            if api == "openai":
                return self._send_json({"error": {"message": "Incorrect API key provided.",
                                                  "type": "invalid_request_error", "param": None,
                                                  "code": "invalid_api_key"}}, status=401)
            return self._send_json({"type": "error", "error": {"type": "authentication_error",
                                                               "message": "invalid x-api-key"}}, status=401)
        if path == "/v1/models" and self.command == "GET":
            if api == "openai":
                return self._send_json({"object": "list", "data": [
                    {"id": "gpt-world", "object": "model", "created": 0, "owned_by": "world"}]})
            return self._send_json({"data": [{"type": "model", "id": "claude-world", "display_name": "World",
                                              "created_at": "2025-01-01T00:00:00Z"}],
                                    "has_more": False, "first_id": "claude-world", "last_id": "claude-world"})
        if path.startswith("/v1/bytes/") and self.command == "GET":
            size = int(path[len("/v1/bytes/"):])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            for chunk in payload_chunks(size, query.get("seed", ["0"])[0]):
                self.wfile.write(chunk)
            return None
        if path == "/v1/upload" and self.command in ("POST", "PUT"):
            sha, length = self._read_body()
            return self._send_json({"sha256": sha, "length": length})
        if path == "/v1/realtime" and self.command == "GET":
            return self._websocket()
        if self.command == "POST" and path == "/v1/responses":
            self._json_body()
            return self._responses_stream()
        if self.command == "POST" and path in ("/v1/chat/completions", "/v1/messages"):
            body = self._json_body()
            if body.get("stream"):
                return self._stream(api)
            if api == "openai":
                return self._send_json({"id": "chatcmpl-world", "object": "chat.completion", "created": 0,
                                        "model": body.get("model", "gpt-world"),
                                        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                                     "message": {"role": "assistant", "content": MODEL_ANSWER}}],
                                        "usage": {"prompt_tokens": 1, "completion_tokens": 6, "total_tokens": 7}})
            return self._send_json({"id": "msg_world", "type": "message", "role": "assistant",
                                    "model": body.get("model", "claude-world"),
                                    "content": [{"type": "text", "text": MODEL_ANSWER}],
                                    "stop_reason": "end_turn", "stop_sequence": None,
                                    "usage": {"input_tokens": 1, "output_tokens": 6}})
        self._drain_body()
        return self.send_error(404)

    def _drain_body(self):
        if self.command in ("POST", "PUT"):
            self._read_body()

    def _json_body(self):
        length = int(self.headers.get("Content-Length", "0"))
        try:
            return json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return {}

    def _stream(self, api: str):
        """Server-sent events, one chunk each, flushed as made (a model's tokens)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        words = MODEL_ANSWER.split(" ")
        events = []
        if api == "openai":
            for n, word in enumerate(words):
                delta = {"role": "assistant", "content": ""} if n < 0 else {"content": (" " if n else "") + word}
                events.append("data: " + json.dumps({
                    "id": "chatcmpl-world", "object": "chat.completion.chunk", "created": 0, "model": "gpt-world",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}) + "\n\n")
            events.append("data: " + json.dumps({
                "id": "chatcmpl-world", "object": "chat.completion.chunk", "created": 0, "model": "gpt-world",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) + "\n\n")
            events.append("data: [DONE]\n\n")
        else:
            def ev(name, data):
                return f"event: {name}\ndata: {json.dumps(data)}\n\n"
            events.append(ev("message_start", {"type": "message_start", "message": {
                "id": "msg_world", "type": "message", "role": "assistant", "model": "claude-world", "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}}))
            events.append(ev("content_block_start", {"type": "content_block_start", "index": 0,
                                                     "content_block": {"type": "text", "text": ""}}))
            for n, word in enumerate(words):
                events.append(ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                         "delta": {"type": "text_delta",
                                                                   "text": (" " if n else "") + word}}))
            events.append(ev("content_block_stop", {"type": "content_block_stop", "index": 0}))
            events.append(ev("message_delta", {"type": "message_delta", "delta": {
                "stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 6}}))
            events.append(ev("message_stop", {"type": "message_stop"}))
        for text in events:
            data = text.encode()
            self.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        return None

    def _responses_stream(self):
        """OpenAI's Responses API, streamed (Codex CLI's way to its model)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        item = {"id": "msg_world", "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": MODEL_ANSWER, "annotations": []}]}
        response = {"id": "resp_world", "object": "response", "created_at": 0, "model": "gpt-world",
                    "status": "in_progress", "output": []}
        events = [("response.created", {"response": response}),
                  ("response.output_item.added", {"output_index": 0, "item": {**item, "status": "in_progress",
                                                                              "content": []}})]
        for n, word in enumerate(MODEL_ANSWER.split(" ")):
            events.append(("response.output_text.delta", {"item_id": "msg_world", "output_index": 0,
                                                          "content_index": 0, "delta": (" " if n else "") + word}))
        events.append(("response.output_item.done", {"output_index": 0, "item": item}))
        events.append(("response.completed", {"response": {
            **response, "status": "completed", "output": [item],
            "usage": {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 6,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 7}}}))
        for name, data in events:
            text = f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()
            self.wfile.write(b"%x\r\n" % len(text) + text + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        return None

    def _websocket(self):
        if (self.headers.get("Upgrade") or "").lower() != "websocket":
            return self.send_error(400, "not an upgrade")
        self.send_response(101)
        self.send_header("Connection", "Upgrade")
        self.send_header("Upgrade", "websocket")
        self.end_headers()
        self.wfile.flush()
        while True:
            data = self.connection.recv(65536)
            if not data:
                break
            self.connection.sendall(data)
        self.close_connection = True
        return None

    def _git_private(self):
        """github.com's /private/repo.git: the world's repository behind Basic auth."""
        import base64
        host = (self.headers.get("Host") or "").split(":")[0].lower()
        path, _ = self._route()
        if host != "github.com" or not path.startswith("/private/"):
            return False
        auth = self.headers.get("Authorization") or ""
        ok = False
        if auth.startswith("Basic "):
            try:
                ok = base64.b64decode(auth[6:]).decode().partition(":")[2] == GIT_REAL_TOKEN
            except ValueError:
                ok = False
        if not ok:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="world"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        self.path = self.path[len("/private"):]
        super().do_GET()
        return True

    def do_GET(self):
        api = self._model_api()
        if api is not None:
            return self._model(api)
        if self._git_private():
            return None
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
        api = self._model_api()
        if api is not None:
            return self._model(api)
        path, _ = self._route()
        if path == "/collect" and _log_file is not None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            with _log_lock, open(os.path.join(os.path.dirname(_log_file.name), "collected.log"), "ab") as f:
                f.write(body + b"\n")
            return self._send_json({"length": length})
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

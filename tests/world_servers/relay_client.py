"""A client that drives downloads and uploads through one of vpnw's doors,
byte for byte, with raw sockets (no library between us and the relay).

    python relay_client.py DOOR CA_PEM < plan.jsonl > results.jsonl

DOOR is http-forward (absolute-URI requests to 127.0.0.1:3128), http-connect
(CONNECT to 127.0.0.1:3128, then TLS verified against CA_PEM) or socks
(SOCKS5 with a host name to 127.0.0.1:1080, then plain HTTP). Each plan line
is {"op": "get"|"put", "host": ..., "size": n, "seed": s}; each op uses a new
connection and prints {"i": ..., "length": ..., "sha256": ...} or {"i": ..., "error": ...}.

With http-forward, "getc"/"putc" are the same with a chunked body, and
{"op": "seq", "steps": [op, ...]} sends its steps one after another on ONE
kept-alive connection, printing {"i": ..., "steps": [result, ...]}; a step
answered with anything but 200 gives {"status": n, "deny": X-Vpnw-Deny} and
ends the sequence (the proxy closes after a refusal).
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from content import payload_chunks  # noqa: E402

HTTP_DOOR = ("127.0.0.1", 3128)
SOCKS_DOOR = ("127.0.0.1", 1080)


class Reader:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("connection closed in the headers")
            self.buf += data
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"connection closed after {len(self.buf)} of {n} bytes")
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def head(self) -> tuple[int, dict]:
        status = int(self.line().split()[1])
        headers = {}
        while line := self.line():
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return status, headers

    def chunked_digest(self) -> tuple[int, str]:
        digest, got = hashlib.sha256(), 0
        while True:
            size = int(self.line().split(b";")[0], 16)
            if size == 0:
                while self.line():
                    pass
                return got, digest.hexdigest()
            n, _ = self.body_digest(size, digest)
            got += n
            if n != size or self.exactly(2) != b"\r\n":
                raise ConnectionError("chunk cut short")

    def body_digest(self, n: int, digest=None) -> tuple[int, str]:
        digest, got = digest or hashlib.sha256(), 0
        take = min(n, len(self.buf))
        digest.update(self.buf[:take])
        got += take
        self.buf = self.buf[take:]
        while got < n:
            data = self.sock.recv(min(1 << 20, n - got))
            if not data:
                break
            digest.update(data)
            got += len(data)
        return got, digest.hexdigest()


def open_tunnel(door: str, host: str, ca: str):
    if door == "http-forward":
        return socket.create_connection(HTTP_DOOR)
    if door == "http-connect":
        sock = socket.create_connection(HTTP_DOOR)
        sock.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
        reader = Reader(sock)
        status, _ = reader.head()
        if status != 200 or reader.buf:
            raise ConnectionError(f"CONNECT answered {status}")
        ctx = ssl.create_default_context(cafile=ca)
        return ctx.wrap_socket(sock, server_hostname=host)
    if door == "socks":
        sock = socket.create_connection(SOCKS_DOOR)
        sock.sendall(b"\x05\x01\x00")
        reader = Reader(sock)
        if reader.exactly(2) != b"\x05\x00":
            raise ConnectionError("SOCKS5 method refused")
        name = host.encode()
        sock.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + (80).to_bytes(2, "big"))
        reply = reader.exactly(4)
        if reply[1] != 0:
            raise ConnectionError(f"SOCKS5 reply {reply[1]}")
        reader.exactly({1: 4, 4: 16}.get(reply[3], 0) or reader.exactly(1)[0])
        reader.exactly(2)
        return sock
    raise ValueError(door)


# A chunked upload's chunk sizes, in turn (below and above the splice threshold).
UPLOAD_CHUNKS = (65537, 1, 1 << 20, 4096, 40000)


def exchange(sock, reader: Reader, target: str, op: dict, *, close: bool) -> dict:
    """One request and its answer on `sock`."""
    host, size, seed, kind = op["host"], op["size"], op["seed"], op["op"]
    conn = "Connection: close\r\n" if close else ""
    if kind in ("get", "getc"):
        path = "bytes" if kind == "get" else "chunked"
        sock.sendall(f"GET {target}/{path}/{size}?seed={seed} HTTP/1.1\r\nHost: {host}\r\n"
                     f"{conn}\r\n".encode())
    else:
        framing = f"Content-Length: {size}" if kind == "put" else "Transfer-Encoding: chunked"
        sock.sendall(f"POST {target}/upload HTTP/1.1\r\nHost: {host}\r\n{framing}\r\n"
                     f"{conn}\r\n".encode())
        n = 0
        for chunk in payload_chunks(size, seed):
            if kind == "put":
                sock.sendall(chunk)
                continue
            view = memoryview(chunk)
            while view:
                piece = view[:UPLOAD_CHUNKS[n % len(UPLOAD_CHUNKS)]]
                n += 1
                sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
                view = view[len(piece):]
        if kind == "putc":
            sock.sendall(b"0\r\n\r\n")
    status, headers = reader.head()
    if status != 200:
        length = int(headers.get("content-length", "0"))
        reader.exactly(length)
        return {"status": status, "deny": headers.get("x-vpnw-deny")}
    if kind == "get":
        length, sha = reader.body_digest(int(headers["content-length"]))
        return {"length": length, "sha256": sha}
    if kind == "getc":
        length, sha = reader.chunked_digest()
        return {"length": length, "sha256": sha}
    answer = json.loads(reader.exactly(int(headers["content-length"])))
    return {"length": answer["length"], "sha256": answer["sha256"]}


def one(door: str, ca: str, i: int, op: dict) -> dict:
    steps = op["steps"] if op["op"] == "seq" else [op]
    results = []
    try:
        with open_tunnel(door, steps[0]["host"], ca) as sock:
            reader = Reader(sock)
            for n, step in enumerate(steps):
                target = f"http://{step['host']}" if door == "http-forward" else ""
                results.append(exchange(sock, reader, target, step, close=n == len(steps) - 1))
                if "status" in results[-1]:
                    break
    except (OSError, ValueError, KeyError) as exc:
        results.append({"error": f"{type(exc).__name__}: {exc}"})
    if op["op"] == "seq":
        return {"i": i, "steps": results}
    result = results[0]
    if "status" in result:
        return {"i": i, "error": f"status {result['status']}"}
    return {"i": i, **result}


def main() -> int:
    door, ca = sys.argv[1], sys.argv[2]
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    plan = [json.loads(line) for line in sys.stdin if line.strip()]
    with ThreadPoolExecutor(workers) as pool:
        for result in pool.map(lambda a: one(door, ca, *a), enumerate(plan)):
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

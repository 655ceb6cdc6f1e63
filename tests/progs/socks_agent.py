"""A test agent: connections through the SOCKS5 door, by a plan on argv.

    socks_agent.py '[["HOST", PORT, N], ...]'

Each HOST (any UTF-8, quotes, backslashes and newlines included: SOCKS5
carries a name as length-prefixed bytes) is asked for N times (default 1),
one connection after another. An accepted connection sends a small HTTP GET
and reads the answer to the end; a refused one is closed. Prints one line per
connection: `HOST ok` or `HOST refused <code>`.
"""
import json
import socket
import struct
import sys


def recv_exactly(sock, n):
    out = b""
    while len(out) < n:
        data = sock.recv(n - len(out))
        if not data:
            raise ConnectionError("closed")
        out += data
    return out


def through_socks(host: str, port: int) -> str:
    with socket.create_connection(("127.0.0.1", 1080), timeout=30) as sock:
        sock.sendall(b"\x05\x01\x00")
        recv_exactly(sock, 2)
        name = host.encode("utf-8")[:255]
        sock.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", port))
        head = recv_exactly(sock, 4)
        if head[1] != 0:
            return f"refused {head[1]}"
        recv_exactly(sock, {1: 4, 4: 16, 3: None}.get(head[3], 4) + 2)
        sock.sendall(b"GET /bytes/100 HTTP/1.0\r\nHost: x\r\n\r\n")
        while sock.recv(65536):
            pass
        return "ok"


def main():
    for host, port, count in json.loads(sys.argv[1]):
        for _ in range(count):
            try:
                result = through_socks(host, int(port))
            except OSError as exc:
                result = f"error {exc}"
            print(repr(host), result, flush=True)


if __name__ == "__main__":
    main()

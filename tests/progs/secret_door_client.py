"""Raw HTTP on a secret door (tests/test_e2e_secrets.py), from inside the
sandbox. Prints one JSON line per step:

    python secret_door_client.py PORT STEPS_JSON

Steps:
  ["raw", NAME, TEXT]       TEXT (latin-1) sent as it is; the answers read to
                            the connection's end (or 10 s): {"name", "answers": [[status, body], ...]}
  ["ws", NAME, N]           a WebSocket upgrade on /v1/realtime, then N bytes echoed back
  ["upload", NAME, N]       POST /v1/upload with N deterministic bytes: the host's sha256
  ["download", NAME, N]     GET /v1/bytes/N: sha256 and length of what came
"""
import hashlib
import json
import random
import socket
import sys


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    return s


def read_all(s, limit=10.0):
    s.settimeout(limit)
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        pass
    return data


def answers(data):
    """[(status, body text)] of the responses in `data` (Content-Length framed, or the rest)."""
    out = []
    while data.startswith(b"HTTP/"):
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ")[1])
        length = None
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
            if name.strip().lower() == b"transfer-encoding":
                chunked = True
        if status == 101:
            out.append([status, ""])
            data = rest
            break
        if chunked:
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    rest = rest.partition(b"\r\n")[2]
                    break
                body += rest[:size]
                rest = rest[size + 2:]
        elif length is None:
            body, rest = rest, b""
        else:
            body, rest = rest[:length], rest[length:]
        out.append([status, body.decode("utf-8", "replace")])
        data = rest
    return out


def payload(n, seed="door"):
    rng = random.Random(f"secret-door:{seed}")
    return rng.randbytes(n)


def main():
    port = int(sys.argv[1])
    for step in json.loads(sys.argv[2]):
        kind, name = step[0], step[1]
        if kind == "raw":
            s = connect(port)
            s.sendall(step[2].encode("latin-1"))
            try:
                s.shutdown(socket.SHUT_WR) if len(step) > 3 and step[3] else None
            except OSError:
                pass
            result = {"name": name, "answers": answers(read_all(s, 5.0))}
            s.close()
        elif kind == "ws":
            s = connect(port)
            s.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: Upgrade\r\n"
                      b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n" % port)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
            status = int(head.split(b" ")[1]) if head else 0
            sent = payload(step[2], name)
            echoed = head.partition(b"\r\n\r\n")[2]
            s.sendall(sent)
            while len(echoed) < len(sent):
                chunk = s.recv(65536)
                if not chunk:
                    break
                echoed += chunk
            s.close()
            result = {"name": name, "status": status, "echoed": echoed == sent}
        elif kind == "upload":
            data = payload(step[2], name)
            s = connect(port)
            s.sendall(b"POST /v1/upload HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %d\r\n"
                      b"Connection: close\r\n\r\n" % (port, len(data)))
            s.sendall(data)
            got = answers(read_all(s, 60.0))
            s.close()
            result = {"name": name, "answers": got, "sha256": hashlib.sha256(data).hexdigest()}
        elif kind == "download":
            s = connect(port)
            s.sendall(b"GET /v1/bytes/%d?seed=%s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n"
                      % (step[2], name.encode(), port))
            data = read_all(s, 60.0)
            s.close()
            body = data.partition(b"\r\n\r\n")[2]
            result = {"name": name, "length": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        else:
            raise SystemExit(f"unknown step {kind}")
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

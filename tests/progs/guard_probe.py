
"""A raw client for vpnw's doors. argv[1]: a JSON list of operations; one JSON
result line per operation on stdout."""
import json
import socket
import struct
import sys
import ipaddress

HTTP_DOOR, SOCKS_DOOR = ("127.0.0.1", 3128), ("127.0.0.1", 1080)


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


class Reader:
    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def head(self):
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"closed before a full head: {self.buf!r}")
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    def body(self, headers):
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(self.buf) < n:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise EOFError("closed inside a body")
                self.buf += chunk
            body, self.buf = self.buf[:n], self.buf[n:]
            return body
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                body, self.buf = self.buf, b""
                return body
            self.buf += chunk

    def response(self):
        status, headers = self.head()
        body = self.body(headers)
        return {"status": status, "headers": headers, "body": body.decode("utf-8", "replace")}


def get_over(sock, host, path):
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    return Reader(sock).response()


def op_connect(op):
    with socket.create_connection(HTTP_DOOR, timeout=30) as s:
        target = f"{op['host']}:{op['port']}"
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        reader = Reader(s)
        status, headers = reader.head()
        out = {"status": status, "headers": headers}
        if status != 200:
            out["body"] = reader.body(headers).decode("utf-8", "replace")
        elif op.get("get"):
            out["inner"] = get_over(s, op.get("host_header", op["host"]), op["get"])
        return out


def op_get(op):
    with socket.create_connection(HTTP_DOOR, timeout=30) as s:
        host = op["url"].split("/")[2]
        s.sendall(f"GET {op['url']} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        return Reader(s).response()


def op_socks(op):
    with socket.create_connection(SOCKS_DOOR, timeout=30) as s:
        s.sendall(b"\x05\x01\x00")
        greeting = recv_exact(s, 2)
        if greeting != b"\x05\x00":
            return {"greeting": greeting.hex()}
        host, atyp = op["host"], op["atyp"]
        if atyp == "domain":
            raw = host.encode()
            address = b"\x03" + bytes([len(raw)]) + raw
        elif atyp == "ipv4":
            address = b"\x01" + ipaddress.IPv4Address(host).packed
        else:
            address = b"\x04" + ipaddress.IPv6Address(host).packed
        s.sendall(b"\x05\x01\x00" + address + struct.pack(">H", op["port"]))
        head = recv_exact(s, 4)
        kind = head[3]
        if kind == 1:
            recv_exact(s, 4 + 2)
        elif kind == 4:
            recv_exact(s, 16 + 2)
        elif kind == 3:
            recv_exact(s, recv_exact(s, 1)[0] + 2)
        out = {"version": head[0], "reply": head[1]}
        if head[1] == 0:
            if op.get("get"):
                out["inner"] = get_over(s, op.get("host_header", host), op["get"])
        else:
            s.settimeout(10)
            try:
                out["after"] = s.recv(100).hex()   # a refused request is closed, not relayed
            except OSError as exc:
                out["after"] = repr(exc)
        return out


def op_keepalive(op):
    """Several absolute-URI requests on one connection, sent one by one or all
    at once (pipelined); every response read in order, until the proxy closes."""
    requests = []
    for url in op["urls"]:
        host = url.split("/")[2]
        requests.append(f"GET {url} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    responses = []
    with socket.create_connection(HTTP_DOOR, timeout=30) as s:
        reader = Reader(s)
        if op.get("pipelined"):
            s.sendall(b"".join(requests))
        for request in requests:
            try:
                if not op.get("pipelined"):
                    s.sendall(request)
                responses.append(reader.response())
            except (EOFError, OSError) as exc:
                responses.append({"eof": repr(exc)})
                break
    return {"responses": responses}


def op_pause(op):
    print(json.dumps({"paused": op["tag"]}), flush=True)
    return {"resumed": sys.stdin.readline().strip()}


OPS = {"connect": op_connect, "get": op_get, "socks": op_socks, "keepalive": op_keepalive,
       "pause": op_pause}

for op in json.loads(open(sys.argv[1]).read()):
    try:
        result = OPS[op["op"]](op)
    except Exception as exc:   # reported, so a test can say what went wrong
        result = {"error": repr(exc)}
    print(json.dumps(result), flush=True)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)

"""Load generator and sink for the benchmarks: C-speed byte moving from Python.

    netload.py serve PORT                     sink + small-request server on 127.0.0.1
    netload.py bulk  --to HOST:PORT [--http P | --socks P] --file F
    netload.py conns --to HOST:PORT [--http P | --socks P] --clients 50 --seconds S [--get /path]
    netload.py lat   --to HOST:PORT [--http P | --socks P] --count N
    netload.py get   --to HOST:PORT [--http P] --path /payload   plain http:// GET
    netload.py post  --to HOST:PORT [--http P] --file F          plain http:// POST of F
    netload.py hold  --to HOST:PORT --socks P --http P --get /path --warm W --held N --count M

Every client command prints one JSON object on stdout. The bulk client sends
the file with os.sendfile (from tmpfs: no copy into Python) and the server
takes it with recv_into one reused buffer, so neither end costs more than a
system call per megabyte. The connection clients drive all their sockets from
one selectors loop (no thread per client, no GIL contention).

Protocol: a connection whose first byte is b"R" gets a 64-byte answer and is
closed; b"B" + an 8-byte length is a bulk upload: the server counts that many
bytes (or to end of stream) and answers with the count as 8 bytes. An HTTP
POST (its head in the first read) is an upload too: the server counts its
Content-Length body and only then answers 204, with the count in a header.

`conns --get /path` speaks HTTP/1.0 to a real web server instead: one GET
(absolute-form to the HTTP proxy on --http, which forwards it; origin-form
direct or in a SOCKS5 tunnel), the answer read to end of stream and checked
(200, the whole body). `hold` is the leak check's client: after a burst of
--warm connections through each door it holds --held tunnels open at once
through the SOCKS5 door, then makes --count forwarded GETs one after another
through the HTTP door, and stops at each checkpoint
(a line on stdout) until a line on stdin lets it go on, so the caller can
look at the broker's fds in between.
"""
from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import struct
import sys
import time

ANSWER = b"A" * 64
REQUEST = b"R" * 16


# ------------------------------------------------------------------ server

def serve(port: int, host: str = "127.0.0.1") -> None:
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((host, port))
    lsock.listen(4096)
    lsock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, None)
    buf = bytearray(4 << 20)
    view = memoryview(buf)
    counts: dict[socket.socket, int] = {}
    expect: dict[socket.socket, int] = {}
    posts: set[socket.socket] = set()
    heads: dict[socket.socket, bytes] = {}    # a POST's head so far (a proxy may send it in pieces)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            if key.data is None:
                for _ in range(64):
                    try:
                        conn, _ = lsock.accept()
                    except BlockingIOError:
                        break
                    conn.setblocking(False)
                    counts[conn] = -1
                    sel.register(conn, selectors.EVENT_READ, 1)
                continue
            try:
                n = sock.recv_into(view)
            except BlockingIOError:
                continue
            except OSError:
                n = 0
            seen = counts[sock]
            if seen < 0 and n and buf[0] == 0x52:        # b"R": a small request
                try:
                    sock.send(ANSWER)
                except OSError:
                    pass
                _drop(sel, counts, sock, expect)
                continue
            if seen < 0 and n and (sock in heads or bytes(buf[:5]) == b"POST "):
                got = heads.pop(sock, b"") + bytes(buf[:n])
                head_end = got.find(b"\r\n\r\n") + 4
                if head_end < 4:
                    if len(got) > 65536:
                        _drop(sel, counts, sock, expect)
                    else:
                        heads[sock] = got
                    continue
                length = _content_length(got[:head_end])
                if length is None:
                    _drop(sel, counts, sock, expect)
                    continue
                posts.add(sock)
                expect[sock] = length
                counts[sock] = seen = 0
                n = len(got) - head_end
                if not n and length:
                    continue
            if seen < 0 and n:
                # b"B" + 8-byte length: answer once that many bytes arrived,
                # since some proxies (squid) end both ways on a half-close.
                expect[sock] = struct.unpack("!Q", bytes(buf[1:9]))[0] if buf[0] == 0x42 else 1 << 62
                n -= 9 if buf[0] == 0x42 else 0
                counts[sock] = seen = 0
                if not n:
                    continue    # the header alone: not the end of the stream
            if n:
                counts[sock] = seen = seen + n
                if seen < expect[sock]:
                    continue
            heads.pop(sock, None)
            try:
                sock.setblocking(True)
                if sock in posts:
                    posts.discard(sock)
                    sock.sendall(b"HTTP/1.1 204 No Content\r\nX-Received: %d\r\n"
                                 b"Connection: close\r\n\r\n" % max(seen, 0))
                else:
                    sock.sendall(struct.pack("!Q", max(seen, 0)))
            except OSError:
                pass
            _drop(sel, counts, sock, expect)


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


def _drop(sel, counts, sock, expect={}) -> None:
    sel.unregister(sock)
    del counts[sock]
    expect.pop(sock, None)
    sock.close()


# ------------------------------------------------------------------ clients

def _handshake_bytes(mode: str, host: str, port: int) -> list:
    """Steps: ("send", bytes) or ("expect", kind) for the proxy handshake."""
    if mode == "http":
        return [("send", f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()),
                ("expect", "http")]
    if mode == "socks":
        name = host.encode()
        return [("send", b"\x05\x01\x00"), ("expect", 2),
                ("send", b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", port)),
                ("expect", "socks")]
    return []


def _complete(kind, data: bytes) -> int:
    """How many bytes of data the expected reply takes, or 0 if incomplete."""
    if kind == "http":
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return 0
        if not data.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
            raise OSError(f"proxy refused: {data[:60]!r}")
        return end + 4
    if kind == "socks":
        if len(data) < 5:
            return 0
        if data[1] != 0:
            raise OSError(f"SOCKS5 reply {data[1]}")
        need = {1: 10, 4: 22, 3: 7 + data[4]}.get(data[3], 10)
        return need if len(data) >= need else 0
    if len(data) < kind:
        return 0
    if data[1] != 0:
        raise OSError(f"SOCKS5 greeting refused: {data!r}")
    return kind


def _blocking_handshake(sock: socket.socket, steps) -> None:
    data = b""
    for op, arg in steps:
        if op == "send":
            sock.sendall(arg)
            continue
        while True:
            used = _complete(arg, data)
            if used:
                data = data[used:]
                break
            chunk = sock.recv(4096)
            if not chunk:
                raise OSError("proxy closed during the handshake")
            data += chunk


def _target(args):
    host, port = args.to.rsplit(":", 1)
    mode = "http" if args.http else "socks" if args.socks else "direct"
    proxy = ("127.0.0.1", args.http or args.socks) if mode != "direct" else None
    return mode, host, int(port), proxy


def _send_file(sock: socket.socket, path: str, size: int) -> int:
    """The file's bytes with os.sendfile (no copy into Python); how many went."""
    with open(path, "rb") as f:
        sent = 0
        while sent < size:
            n = os.sendfile(sock.fileno(), f.fileno(), sent, size - sent)
            if n == 0:
                break
            sent += n
    return sent


def bulk(args) -> dict:
    mode, host, port, proxy = _target(args)
    size = os.path.getsize(args.file)
    started = time.perf_counter()
    sock = socket.create_connection(proxy or (host, port))
    _blocking_handshake(sock, _handshake_bytes(mode, host, port))
    handshake = time.perf_counter() - started
    sock.sendall(b"B" + struct.pack("!Q", size))
    sent = _send_file(sock, args.file, size)
    reply = b""
    while len(reply) < 8:
        chunk = sock.recv(8)
        if not chunk:
            break
        reply += chunk
    seconds = time.perf_counter() - started
    sock.close()
    got = struct.unpack("!Q", reply)[0] if len(reply) == 8 else -1
    return {"bytes": sent, "received": got, "seconds": seconds, "handshake_s": handshake,
            "gbps": sent / seconds / 1e9}


class _Conn:
    __slots__ = ("sock", "steps", "at", "data", "started")


def _http_get(mode: str, host: str, port: int, path: str) -> bytes:
    """HTTP/1.0 (the server closes after its answer): absolute-form to an
    HTTP proxy, which forwards it; origin-form to the server itself."""
    target = f"http://{host}:{port}{path}" if mode == "http" else path
    return f"GET {target} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode()


def whole_http_answer(data: bytes) -> bool:
    """A 200 whose body is all there (Content-Length bytes)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep or not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) == int(value)
    return True         # no length: the end of stream was the end of the body


def _exchange(mode: str, host: str, port: int, get_path: str | None):
    """One connection's steps and the check of what came back: the sink's
    R protocol, or with get_path an HTTP GET (forwarded by an HTTP proxy, not
    tunnelled: what a plain http:// client does)."""
    if get_path is None:
        return (_handshake_bytes(mode, host, port) + [("send", REQUEST), ("expect_eof", None)],
                lambda data: data == ANSWER)
    handshake = [] if mode == "http" else _handshake_bytes(mode, host, port)
    return (handshake + [("send", _http_get(mode, host, port, get_path)), ("expect_eof", None)],
            whole_http_answer)


def _address(host: str, port: int, proxy) -> tuple:
    """Where to connect: the proxy, or the server's name resolved once (as a
    client like ab does), so a direct run does not pay a look-up per connection."""
    if proxy:
        return proxy
    return socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]


def get(args) -> dict:
    """One plain http:// GET (absolute URI through the HTTP proxy on --http,
    origin-form direct); the body read with recv_into one 4 MiB buffer, so
    the client is never what caps the figure. Timed from the request on."""
    host, port = args.to.rsplit(":", 1)
    sock = socket.create_connection(("127.0.0.1", args.http) if args.http else (host, int(port)))
    target = f"http://{args.to}{args.path}" if args.http else args.path
    started = time.perf_counter()
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {args.to}\r\nConnection: close\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(65536)
        if not data:
            raise OSError("closed in the head")
        head += data
    head, _, got = head.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise OSError(f"answer: {head[:60]!r}")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    buf = bytearray(4 << 20)
    received = len(got)
    while received < length:
        n = sock.recv_into(buf)
        if not n:
            break
        received += n
    elapsed = time.perf_counter() - started
    sock.close()
    return {"bytes": received, "length": length, "seconds": elapsed, "gbps": received / elapsed / 1e9}


def post(args) -> dict:
    """One plain http:// POST of --file (absolute URI through the HTTP proxy
    on --http, origin-form direct) to the sink, the body sent with
    os.sendfile; timed from the request to the sink's answer, which comes
    only once the whole body has arrived (and says how much did)."""
    host, port = args.to.rsplit(":", 1)
    sock = socket.create_connection(("127.0.0.1", args.http) if args.http else (host, int(port)))
    target = f"http://{args.to}{args.path}" if args.http else args.path
    size = os.path.getsize(args.file)
    started = time.perf_counter()
    sock.sendall(f"POST {target} HTTP/1.1\r\nHost: {args.to}\r\nContent-Length: {size}\r\nConnection: close\r\n"
                 f"Content-Type: application/octet-stream\r\n\r\n".encode())
    sent = _send_file(sock, args.file, size)
    answer = _read_to_end(sock)
    elapsed = time.perf_counter() - started
    sock.close()
    if not answer.startswith(b"HTTP/1.1 204"):
        raise OSError(f"answer: {answer[:60]!r}")
    received = int(answer.lower().split(b"x-received:")[1].split(b"\r\n")[0])
    return {"bytes": received, "sent": sent, "seconds": elapsed, "gbps": received / elapsed / 1e9}


def conns(args) -> dict:
    """`clients` connections at a time, each: connect, handshake, one small
    request, read the answer to end of stream, close; replaced at once. With
    --rate R, paced instead: a new connection every 1/R s (at most `clients`
    open), so latency is measured at a load the server keeps up with."""
    mode, host, port, proxy = _target(args)
    steps, answered = _exchange(mode, host, port, args.get)
    address = _address(host, port, proxy)
    sel = selectors.DefaultSelector()
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + args.seconds
    limit = args.count or 1 << 62
    opened = 0

    def open_one():
        nonlocal opened
        c = _Conn()
        c.sock = socket.socket()
        c.sock.setblocking(False)
        c.steps, c.at, c.data = steps, 0, b""
        c.started = time.perf_counter()
        opened += 1
        try:
            c.sock.connect(address)
        except BlockingIOError:
            pass
        sel.register(c.sock, selectors.EVENT_WRITE, c)

    def advance(c: _Conn) -> bool:
        """Run steps as far as possible; True when the connection is over."""
        while c.at < len(c.steps):
            op, arg = c.steps[c.at]
            if op == "send":
                c.sock.send(arg)     # small: fits the empty send buffer
                c.at += 1
                continue
            try:
                chunk = c.sock.recv(65536)
            except BlockingIOError:
                return False
            if op == "expect_eof":
                if not chunk:
                    return True
                c.data += chunk
                continue
            if not chunk:
                raise OSError("closed during the handshake")
            c.data += chunk
            used = _complete(arg, c.data)
            if not used:
                return False
            c.data = c.data[used:]
            c.at += 1
        return True

    started = time.perf_counter()
    paced = bool(args.rate)
    interval = 1.0 / args.rate if paced else 0.0
    next_at = started

    def may_open() -> bool:
        return opened < limit and time.perf_counter() < deadline

    if not paced:
        for _ in range(min(args.clients, limit)):
            open_one()
    done = 0
    while sel.get_map() or (paced and may_open()):
        timeout = 5.0
        if paced and may_open():
            while next_at <= time.perf_counter() and len(sel.get_map()) < args.clients and may_open():
                open_one()
                next_at += interval
            timeout = max(0.0, next_at - time.perf_counter())
        for key, events in sel.select(timeout=timeout):
            c = key.data
            ok = False
            try:
                if events & selectors.EVENT_WRITE:
                    err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise OSError(err, os.strerror(err))
                    sel.modify(c.sock, selectors.EVENT_READ, c)
                over = advance(c)
                if over and not answered(c.data):
                    raise OSError(f"bad answer {c.data[:40]!r}")
                ok = over
            except OSError:
                errors += 1
                over = True
            if over:
                if ok:
                    latencies.append(time.perf_counter() - c.started)
                done += 1
                sel.unregister(c.sock)
                c.sock.close()
                if not paced and may_open():
                    open_one()
    seconds = time.perf_counter() - started
    latencies.sort()
    ok = len(latencies)
    return {"connections": ok, "errors": errors, "seconds": seconds, "rate": ok / seconds,
            "p50_ms": 1e3 * latencies[ok // 2] if ok else None,
            "p99_ms": 1e3 * latencies[min(ok - 1, int(ok * 0.99))] if ok else None}


def lat(args) -> dict:
    """One connection at a time: connect, handshake, request, answer, close."""
    mode, host, port, proxy = _target(args)
    steps = _handshake_bytes(mode, host, port)
    times = []
    for _ in range(args.count):
        started = time.perf_counter()
        sock = socket.create_connection(proxy or (host, port))
        _blocking_handshake(sock, steps)
        sock.sendall(REQUEST)
        data = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        sock.close()
        if data != ANSWER:
            raise SystemExit(f"bad answer {data[:40]!r}")
        times.append(time.perf_counter() - started)
    times.sort()
    return {"count": len(times), "p50_ms": 1e3 * statistics.median(times),
            "p99_ms": 1e3 * times[min(len(times) - 1, int(len(times) * 0.99))]}


def _read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _checkpoint(line: str) -> None:
    """Say where we are; go on when the caller answers with a line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    sys.stdin.readline()


def hold(args) -> dict:
    """The leak check's client: a burst of --warm connections through each
    door, then --held tunnels open at once (SOCKS5 door) and a GET in each,
    then --count forwarded GETs one after another (HTTP door). `made` counts
    the connections the doors accepted: each must end in the record."""
    _, host, port, _ = _target(args)
    made = errors = 0

    def connect_through(mode: str) -> socket.socket | None:
        """A connection through the door of that mode, handshake done; None
        (an error counted) when the door or the handshake fails."""
        nonlocal made, errors
        try:
            sock = socket.create_connection(("127.0.0.1", args.socks if mode == "socks" else args.http))
        except OSError:
            errors += 1
            return None
        made += 1
        try:
            if mode == "socks":
                _blocking_handshake(sock, _handshake_bytes("socks", host, port))
            return sock
        except OSError:
            errors += 1
            sock.close()
            return None

    def one_get(sock: socket.socket | None, mode: str) -> None:
        nonlocal errors
        if sock is None:
            return
        try:
            sock.sendall(_http_get(mode, host, port, args.get))
            errors += not whole_http_answer(_read_to_end(sock))
        except OSError:
            errors += 1
        finally:
            sock.close()

    # A burst through each door first (all open before the first GET): what
    # vpnw sets up once, at start-up, on a first connection or when it first
    # sees load, is then in place before the count starts.
    for mode in ("socks", "http"):
        for sock in [connect_through(mode) for _ in range(args.warm)]:
            one_get(sock, mode)
    _checkpoint("ready")
    held = [sock for sock in (connect_through("socks") for _ in range(args.held)) if sock is not None]
    _checkpoint(f"held {len(held)}")
    for sock in held:
        one_get(sock, "socks")
    for _ in range(args.count):
        one_get(connect_through("http"), "http")
    result = {"made": made, "warm": args.warm, "held": len(held), "sequential": args.count, "errors": errors}
    _checkpoint("done")
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="netload")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("port", type=int)
    s.add_argument("host", nargs="?", default="127.0.0.1")
    for name in ("bulk", "conns", "lat", "get", "post", "hold"):
        p = sub.add_parser(name)
        p.add_argument("--to", required=True)
        p.add_argument("--http", type=int)
        p.add_argument("--socks", type=int)
        p.add_argument("--file")
        p.add_argument("--clients", type=int, default=50)
        p.add_argument("--seconds", type=float, default=3.0)
        p.add_argument("--count", type=int, default=0)
        p.add_argument("--rate", type=float, default=0.0, help="conns: new connections a second (0: as fast as answered)")
        p.add_argument("--path", default="/")
        p.add_argument("--get", help="conns, hold: an HTTP GET of this path, not the sink's R")
        p.add_argument("--held", type=int, default=1000)
        p.add_argument("--warm", type=int, default=100)
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        serve(args.port, args.host)
        return
    result = {"bulk": bulk, "conns": conns, "lat": lat, "get": get, "post": post,
              "hold": hold}[args.cmd](args)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()

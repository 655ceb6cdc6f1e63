"""The whole broker, driven through a real handoff link on this machine's
loopback: a test accepts client sockets on a loopback "door" and hands them
over exactly as the helper would; destinations are listeners on 127.0.0.1/::1.

Loopback destinations need Policy.allow_all() (deny_private would refuse
them) or a policy with deny_private = false.
"""
from __future__ import annotations

import http.server
import json
import os
import socket
import struct
import tempfile
import threading
import time
from collections import Counter, defaultdict

import pytest
import requests

from stages.wire import handoff
from stages.broker.main import main_from_fds
from stages.config.policy import Policy, parse_policy
from stages.record.events import parse_line
from stages.record.check import schema_problems

# Their origins listen on this machine's loopback, which vpnw never dials:
# step 4 (the machine itself) is left out here and tested in test_decide.py
# and the end-to-end tests.
pytestmark = pytest.mark.usefixtures("origins_on_loopback")

# --- destinations ------------------------------------------------------------


class EchoServer:
    """Echoes until EOF, then shuts down its side."""

    def __init__(self, host="127.0.0.1"):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family)
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)

    def close(self):
        self.sock.close()


class Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if not size:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(length)
        seen = {k.lower(): v for k, v in self.headers.items()}
        payload = json.dumps({"port": self.server.server_address[1], "path": self.path,
                              "method": self.command, "len": len(body),
                              "headers": seen}).encode()
        if self.path.startswith("/chunked"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (payload[:5], payload[5:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args):
        pass


def start_origin():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# --- the broker under test ---------------------------------------------------


class BrokerRun:
    """A broker in a thread, fed through a real handoff link by a loopback door."""

    def __init__(self, policy=None, dry_run=False, grace=2.0):
        self.helper_end, self.broker_end = handoff.link()
        self.events_file = tempfile.TemporaryFile()
        self.status_r, self.status_w = os.pipe()
        self.door = socket.socket()
        self.door.bind(("127.0.0.1", 0))
        self.door.listen(64)
        self.door_port = self.door.getsockname()[1]
        self.handed = self.connected = 0
        self.result = None
        self.thread = threading.Thread(target=self._run, args=(policy, dry_run, grace), daemon=True)
        self.thread.start()
        self.accepter = threading.Thread(target=self._accept, daemon=True)
        self.next_door = "http"
        self.lock = threading.Lock()
        self.accepter.start()

    def _run(self, policy, dry_run, grace):
        # One broker process: this one runs in a thread of pytest's, which
        # must not fork (the workers are tested through vpnw, test_e2e_load).
        self.result = main_from_fds(self.broker_end.fileno(), self.events_file.fileno(), self.status_w,
                                    run_id="r-test", policy=policy or Policy.allow_all(), path=None,
                                    dry_run=dry_run, grace=grace, workers=1)

    def _accept(self):
        while True:
            try:
                conn, _ = self.door.accept()
            except OSError:
                return
            door = self.pending_door.pop(0)
            handoff.send_conn(self.helper_end, door, conn.fileno())
            conn.close()
            self.handed += 1

    pending_door: list

    def connect(self, door: str) -> socket.socket:
        """A client connection to `door`, handed over as the helper would."""
        self.pending_door.append(door)
        self.connected += 1
        sock = socket.create_connection(("127.0.0.1", self.door_port), timeout=20)
        return sock

    def finish(self):
        """The helper goes away; the broker winds down and reports."""
        deadline = time.monotonic() + 20
        while self.handed < self.connected and time.monotonic() < deadline:
            time.sleep(0.005)          # let the door hand over what it accepted
        self.door.close()
        self.helper_end.close()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the broker did not stop"
        os.close(self.status_w)
        with os.fdopen(self.status_r, "rb") as f:
            self.status = [json.loads(line) for line in f]
        self.events_file.seek(0)
        self.events = [parse_line(line) for line in self.events_file]
        self.broker_end.close()
        check_event_invariants(self.events)
        return self

    def of(self, type_):
        return [e for e in self.events if e["type"] == type_]


@pytest.fixture
def run_broker():
    runs = []

    def start(**kw):
        r = BrokerRun(**kw)
        r.pending_door = []
        runs.append(r)
        return r

    yield start
    for r in runs:
        if r.thread.is_alive():
            r.helper_end.close()
            r.thread.join(10)


def check_event_invariants(events):
    """Every conn.request ends exactly once; every conn.open closes once."""
    by_conn = defaultdict(list)
    for e in events:
        assert e["run"] == "r-test"
        assert e["path"] == "direct"
        if e["type"].startswith(("conn.", "policy.", "dns.")):
            assert isinstance(e["conn"], int)
            by_conn[e["conn"]].append(e)
    for conn, evs in by_conn.items():
        types = [e["type"] for e in evs]
        endings = [t for t, e in zip(types, evs)
                   if t in ("conn.fail", "conn.open") or (t == "policy.deny" and e["fields"]["enforced"])]
        assert len(endings) == 1, (conn, types)
        if "conn.request" in types:
            assert types[0] == "conn.request", types
        else:
            assert types == ["conn.fail"] and evs[0]["fields"]["stage"] == "handshake", types
        assert types.count("conn.close") == types.count("conn.open"), types
        if "conn.close" in types:
            assert types[-1] == "conn.close"
        # A decision names its destination itself, as the request did (no join needed).
        asked = [{k: e["fields"][k] for k in ("host", "port", "door")}
                 for e in evs if e["type"] == "conn.request"]
        for e in evs:
            if e["type"].startswith("policy."):
                assert [{k: e["fields"][k] for k in ("host", "port", "door")}] == asked, evs
    fields = {
        "conn.request": {"door", "kind", "host", "port"},
        "policy.allow": {"rule", "reason", "host", "port", "door"},
        "policy.deny": {"rule", "reason", "enforced", "host", "port", "door"},
        "conn.open": {"address", "port", "via", "ms"},
        "conn.fail": {"stage", "error", "reason"},
        "conn.close": {"bytes_up", "bytes_down", "ms"},
        "dns.resolve": {"host", "addresses", "ms"},
        "path.check": {"path", "type", "ok", "ms"},
    }
    for e in events:
        assert schema_problems(e) == [], e
        need = fields[e["type"]]
        assert need <= set(e["fields"]), e
        extra = set(e["fields"]) - need
        assert extra <= {"error"}, e


def recv_exactly(sock, n):
    out = b""
    while len(out) < n:
        data = sock.recv(n - len(out))
        assert data, "connection closed early"
        out += data
    return out


def recv_head(sock) -> bytes:
    out = b""
    while b"\r\n\r\n" not in out:
        data = sock.recv(1)
        assert data, out
        out += data
    return out


def socks_connect(sock, atyp: int, raw_host: bytes, port: int) -> bytes:
    sock.sendall(b"\x05\x01\x00")
    assert recv_exactly(sock, 2) == b"\x05\x00"
    sock.sendall(b"\x05\x01\x00" + bytes([atyp]) + raw_host + struct.pack("!H", port))
    head = recv_exactly(sock, 4)
    rest = recv_exactly(sock, {1: 4, 4: 16}[head[3]] + 2)
    return head + rest


# --- tests ---------------------------------------------------------------------


def test_http_connect_relays_and_records(run_broker):
    echo = EchoServer()
    b = run_broker()
    with b.connect("http") as c:
        c.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\nearly" % echo.port)
        assert recv_head(c).startswith(b"HTTP/1.1 200 ")
        c.sendall(b"-and-more")
        c.shutdown(socket.SHUT_WR)
        got = b""
        while data := c.recv(65536):
            got += data
    assert got == b"early-and-more"
    b.finish()
    assert b.status[0]["path_ok"]["path"] == "direct"
    assert b.status[-1] == {"totals": {"connections": 1, "denied": 0, "would_deny": 0, "failed": 0}}
    assert b.result == 0
    req, = b.of("conn.request")
    assert req["fields"] == {"door": "http", "kind": "http-connect", "host": "127.0.0.1", "port": echo.port}
    assert b.of("dns.resolve") == []          # an address needs no look-up
    assert b.of("conn.open")[0]["fields"]["address"] == "127.0.0.1"
    close, = b.of("conn.close")
    assert (close["fields"]["bytes_up"], close["fields"]["bytes_down"]) == (14, 14)
    assert b.of("path.check")[0]["fields"]["ok"] is True
    echo.close()


def test_connect_by_name_is_resolved_even_without_a_policy(run_broker):
    echo = EchoServer()
    b = run_broker()
    with b.connect("http") as c:
        c.sendall(b"CONNECT localhost:%d HTTP/1.1\r\n\r\n" % echo.port)
        assert recv_head(c).startswith(b"HTTP/1.1 200 ")
        c.sendall(b"ping")
        assert recv_exactly(c, 4) == b"ping"
    b.finish()
    dns, = b.of("dns.resolve")
    assert dns["fields"]["host"] == "localhost" and "127.0.0.1" in dns["fields"]["addresses"]
    echo.close()


def test_keep_alive_requests_to_two_hosts_are_decided_separately(run_broker):
    a, c = start_origin(), start_origin()
    pa, pc = a.server_address[1], c.server_address[1]
    policy = parse_policy(f'version = 1\nname = "t"\n[policy]\ndefault = "deny"\n'
                          f'deny_private = false\nallow = ["127.0.0.1:{pa}"]\n')
    b = run_broker(policy=policy)
    with b.connect("http") as s:
        s.sendall(b"GET http://127.0.0.1:%d/one HTTP/1.1\r\nProxy-Authorization: Basic eDp5\r\n"
                  b"Proxy-Connection: keep-alive\r\n\r\n" % pa)
        head = recv_head(s)
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        first = json.loads(recv_exactly(s, length))
        assert first["path"] == "/one" and first["port"] == pa
        assert "proxy-authorization" not in first["headers"]
        assert "proxy-connection" not in first["headers"]
        assert first["headers"]["host"] == f"127.0.0.1:{pa}"
        # Second request, same client connection, another host: its own decision.
        s.sendall(b"GET http://127.0.0.1:%d/two HTTP/1.1\r\n\r\n" % pc)
        head = recv_head(s)
        assert head.startswith(b"HTTP/1.1 403")
        assert b"X-Vpnw-Deny: no allow rule matches 127.0.0.1:%d" % pc in head
    b.finish()
    reqs = b.of("conn.request")
    assert [(r["fields"]["kind"], r["fields"]["port"]) for r in reqs] == [("http-forward", pa), ("http-forward", pc)]
    assert [e["type"] for e in b.events if e["conn"] == reqs[1]["conn"]] == ["conn.request", "policy.deny"]
    assert b.status[-1]["totals"]["denied"] == 1
    a.shutdown()
    c.shutdown()


def test_requests_session_reuses_the_client_connection(run_broker):
    a, c = start_origin(), start_origin()
    pa, pc = a.server_address[1], c.server_address[1]
    b = run_broker()
    proxies = {"http": f"http://127.0.0.1:{b.door_port}"}
    b.pending_door.extend(["http"] * 4)
    with requests.Session() as session:
        urls = [f"http://127.0.0.1:{pa}/1", f"http://127.0.0.1:{pa}/2", f"http://127.0.0.1:{pc}/chunked",
                f"http://127.0.0.1:{pa}/3"]
        answers = [session.get(u, proxies=proxies, timeout=20).json() for u in urls]
        posted = session.post(f"http://127.0.0.1:{pa}/p", data=b"z" * 300000, proxies=proxies, timeout=20).json()
        chunked = session.post(f"http://127.0.0.1:{pa}/c", data=iter([b"ab", b"cde"]), proxies=proxies,
                               timeout=20).json()
    assert [x["path"] for x in answers] == ["/1", "/2", "/chunked", "/3"]
    assert [x["port"] for x in answers] == [pa, pa, pc, pa]
    assert posted["len"] == 300000 and chunked["len"] == 5
    b.finish()
    # One client connection (requests keeps it alive) and one upstream per run
    # of requests to the same host:port.
    reqs = b.of("conn.request")
    assert [r["fields"]["port"] for r in reqs] == [pa, pc, pa]
    assert len(b.of("conn.close")) == 3
    a.shutdown()
    c.shutdown()


@pytest.mark.parametrize("atyp,raw_host", [
    (1, bytes([127, 0, 0, 1])),
    (3, b"\x09localhost"),
    (4, bytes(15) + b"\x01"),
])
def test_socks5_connect_by_ipv4_name_and_ipv6(run_broker, atyp, raw_host):
    echo = EchoServer("::1" if atyp == 4 else "127.0.0.1")
    b = run_broker()
    with b.connect("socks") as s:
        reply = socks_connect(s, atyp, raw_host, echo.port)
        assert reply[1] == 0x00
        s.sendall(b"hello socks")
        s.shutdown(socket.SHUT_WR)
        got = b""
        while data := s.recv(100):
            got += data
    assert got == b"hello socks"
    b.finish()
    req, = b.of("conn.request")
    assert req["fields"]["kind"] == "socks5" and req["fields"]["door"] == "socks"
    assert req["fields"]["host"] == {1: "127.0.0.1", 3: "localhost", 4: "::1"}[atyp]
    assert len(b.of("dns.resolve")) == (1 if atyp == 3 else 0)
    echo.close()


@pytest.mark.parametrize("command", [2, 3])
def test_socks5_bind_and_udp_get_07(run_broker, command):
    b = run_broker()
    with b.connect("socks") as s:
        s.sendall(b"\x05\x01\x00")
        assert recv_exactly(s, 2) == b"\x05\x00"
        s.sendall(bytes([5, command, 0, 1, 127, 0, 0, 1, 0, 80]))
        assert recv_exactly(s, 10)[:2] == b"\x05\x07"
    b.finish()
    fail, = b.of("conn.fail")
    assert fail["fields"]["stage"] == "handshake"


def test_refused_destination_is_05_and_conn_fail(run_broker):
    port = closed_port()
    b = run_broker()
    with b.connect("socks") as s:
        assert socks_connect(s, 1, bytes([127, 0, 0, 1]), port)[1] == 0x05
    with b.connect("http") as s:
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % port)
        assert recv_head(s).startswith(b"HTTP/1.1 502")
    b.finish()
    fails = b.of("conn.fail")
    assert [(f["fields"]["stage"], f["fields"]["error"]) for f in fails] == [("dial", "refused")] * 2
    assert b.status[-1]["totals"]["failed"] == 2


def test_bad_target_names_are_denied_and_never_looked_up(run_broker):
    b = run_broker()
    with b.connect("socks") as s:
        assert socks_connect(s, 3, b"\x0a2130706433", 80)[1] == 0x02
    with b.connect("http") as s:
        s.sendall(b"CONNECT 0x7f.1:443 HTTP/1.1\r\n\r\n")
        head = recv_head(s)
        assert head.startswith(b"HTTP/1.1 403") and b"X-Vpnw-Deny: " in head
    b.finish()
    assert b.of("dns.resolve") == []
    denies = b.of("policy.deny")
    assert [(d["fields"]["rule"], d["fields"]["enforced"]) for d in denies] == [("target", True)] * 2


def test_dry_run_records_the_denial_and_lets_the_connection_through(run_broker):
    echo = EchoServer()
    policy = parse_policy('version = 1\nname = "t"\n[policy]\ndefault = "deny"\nallow = ["example.com"]\n')
    b = run_broker(policy=policy, dry_run=True)
    with b.connect("socks") as s:
        assert socks_connect(s, 1, bytes([127, 0, 0, 1]), echo.port)[1] == 0x00
        s.sendall(b"x")
        assert recv_exactly(s, 1) == b"x"
    b.finish()
    deny, = b.of("policy.deny")
    assert deny["fields"]["enforced"] is False
    assert len(b.of("conn.open")) == 1
    assert b.status[-1]["totals"] == {"connections": 1, "denied": 0, "would_deny": 1, "failed": 0}
    echo.close()


def test_malformed_handshakes_fail_cleanly(run_broker):
    b = run_broker()
    with b.connect("http") as s:
        s.sendall(b"GET /not-a-proxy-request HTTP/1.1\r\n\r\n")
        assert recv_head(s).startswith(b"HTTP/1.1 400")
    with b.connect("socks") as s:
        s.sendall(b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00")
        assert s.recv(10) == b""
    with b.connect("http") as s:
        pass                                  # closed without a byte: nothing to record
    b.finish()
    fails = b.of("conn.fail")
    assert [(f["fields"]["stage"], f["fields"]["error"]) for f in fails] == [("handshake", "bad-request")] * 2
    assert b.of("conn.request") == []


def test_bad_handoff_message_is_skipped(run_broker):
    echo = EchoServer()
    b = run_broker()
    b.helper_end.send(b"XX")                  # no descriptor, wrong bytes
    with b.connect("socks") as s:
        assert socks_connect(s, 1, bytes([127, 0, 0, 1]), echo.port)[1] == 0x00
    b.finish()
    assert b.result == 0 and len(b.of("conn.open")) == 1
    echo.close()


def test_open_relays_are_closed_after_the_grace_period(run_broker):
    echo = EchoServer()
    b = run_broker(grace=0.2)
    s = b.connect("socks")
    assert socks_connect(s, 1, bytes([127, 0, 0, 1]), echo.port)[1] == 0x00
    s.sendall(b"still open")
    assert recv_exactly(s, 10) == b"still open"
    b.finish()                                 # the helper is gone; the tunnel is still open
    assert s.recv(100) == b""                  # the broker closed it
    close, = b.of("conn.close")
    assert close["fields"]["bytes_up"] == 10
    assert b.status[-1]["totals"]["connections"] == 1
    s.close()
    echo.close()


def test_many_connections_on_one_loop(run_broker):
    echo = EchoServer()
    b = run_broker()
    socks = []
    for i in range(100):
        s = b.connect("socks")
        s.sendall(b"\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01" + struct.pack("!H", echo.port))
        socks.append(s)
    for i, s in enumerate(socks):
        assert recv_exactly(s, 12)[:3] == b"\x05\x00\x05"
        s.sendall(b"%05d" % i)
    for i, s in enumerate(socks):
        assert recv_exactly(s, 5) == b"%05d" % i
        s.close()
    b.finish()
    assert len(b.of("conn.close")) == 100
    assert Counter(e["type"] for e in b.events)["conn.open"] == 100
    echo.close()


def test_a_request_still_dialling_at_the_end_is_recorded_as_failed(run_broker):
    """A destination whose accept queue is full never answers the SYN, so the
    dial is still pending when the helper goes away."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    fillers = []
    for _ in range(3):
        f = socket.socket()
        f.setblocking(False)
        f.connect_ex(full.getsockname())
        fillers.append(f)
    b = run_broker(grace=0.1)
    s = b.connect("socks")
    s.sendall(b"\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01" + struct.pack("!H", full.getsockname()[1]))
    assert recv_exactly(s, 2) == b"\x05\x00"
    # wait until the broker has recorded the request, then end the run
    for _ in range(200):
        b.events_file.seek(0)
        if b"conn.request" in b.events_file.read():
            break
        time.sleep(0.01)
    b.finish()
    fail, = b.of("conn.fail")
    assert fail["fields"]["stage"] == "dial" and fail["fields"]["error"] == "internal"
    s.close()
    for f in fillers:
        f.close()
    full.close()


def test_close_delimited_response_ends_the_client_connection(run_broker):
    origin = socket.socket()
    origin.bind(("127.0.0.1", 0))
    origin.listen()

    def serve():
        conn, _ = origin.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(1024)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it, until close")

    threading.Thread(target=serve, daemon=True).start()
    b = run_broker()
    with b.connect("http") as s:
        s.sendall(b"GET http://127.0.0.1:%d/ HTTP/1.1\r\n\r\n" % origin.getsockname()[1])
        got = b""
        while data := s.recv(1024):
            got += data
    head, body = got.split(b"\r\n\r\n", 1)
    assert b"Connection: close" in head and body == b"all of it, until close"
    b.finish()
    close, = b.of("conn.close")
    assert close["fields"]["bytes_down"] == len(got)
    origin.close()

"""A hostile helper on the handoff link.

The helper shares the sandbox with the program it guards, so the broker takes
nothing it sends on trust: junk messages, wrong descriptor counts, descriptors
that are not TCP sockets (a pipe, a Unix socket, a file, a UDP socket),
oversized messages. Each is refused (HandoffError) with every descriptor that
came with it closed, and the broker keeps serving the honest connections that
follow. Also: the broker's cap on connections waiting for their first request.
"""
from __future__ import annotations

import array
import os
import socket
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stages.wire import handoff
from test_broker import EchoServer, run_broker, socks_connect  # noqa: F401  (fixture)

FD_KINDS = ["pipe", "unix", "file", "udp", "tcp-unconnected", "tcp-connected", "tcp-listening"]

# The whole-broker tests dial an echo server on this machine's loopback,
# which vpnw never dials by itself (the machine step): leave it out here.
pytestmark = pytest.mark.usefixtures("origins_on_loopback")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Descriptors:
    """Makes the descriptors a hostile helper could attach; owns their peers."""

    def __init__(self):
        self.peers: list = []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.scratch = tempfile.TemporaryFile()

    def make(self, kind: str) -> int:
        if kind == "pipe":
            r, w = os.pipe()
            os.close(w)
            return r
        if kind == "unix":
            a, b = socket.socketpair()
            self.peers.append(b)
            return a.detach()
        if kind == "file":
            return os.dup(self.scratch.fileno())
        if kind == "udp":
            return socket.socket(socket.AF_INET, socket.SOCK_DGRAM).detach()
        if kind == "tcp-unconnected":
            return socket.socket().detach()
        if kind == "tcp-listening":
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen()
            return s.detach()
        client = socket.create_connection(self.listener.getsockname())
        server, _ = self.listener.accept()
        self.peers.append(client)
        return server.detach()

    def close(self):
        for p in self.peers:
            p.close()
        self.peers.clear()
        self.listener.close()
        self.scratch.close()


def send(helper_end: socket.socket, message: bytes, fds: list[int]) -> None:
    try:
        if fds:
            helper_end.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        else:
            helper_end.send(message)
    finally:
        for fd in fds:
            os.close(fd)       # the sender's copies; the broker owns what it received


# --- receive alone: every message is accepted or refused, nothing leaks ------

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=st.one_of(st.binary(max_size=80),
                         st.sampled_from([b"CH", b"CS", b"CX", b"C", b"CHH", b"ch", b"H",
                                          b"LH", b"LS", b"LX", b"L", b"LHH", b"lh"])),
       kinds=st.lists(st.sampled_from(FD_KINDS), max_size=5))
def test_any_message_is_a_door_a_connection_or_a_handoff_error(message, kinds):
    helper_end, broker_end = handoff.link()
    descriptors = Descriptors()
    try:
        before = open_fds()
        fds = [descriptors.make(k) for k in kinds]
        if not message and not fds:
            return  # an empty datagram is the link's end of stream
        send(helper_end, message, fds)
        try:
            got = handoff.receive(broker_end)
        except handoff.HandoffError:
            got = None
        valid = len(kinds) == 1 and (
            (message in (b"CH", b"CS") and kinds[0] in ("tcp-unconnected", "tcp-connected"))
            or (message in (b"LH", b"LS") and kinds[0] == "tcp-listening"))
        assert (got is not None) == valid, (message, kinds, got)
        if got is not None:
            assert got.kind == {b"C": "conn", b"L": "door"}[message[:1]]
            assert got.door == {b"H": "http", b"S": "socks"}[message[1:]]
            assert got.sock.type == socket.SOCK_STREAM
            got.sock.close()
        # Every descriptor that arrived was closed or handed back and closed.
        assert open_fds() == before + len(descriptors.peers)
    finally:
        descriptors.close()
        helper_end.close()
        broker_end.close()


@pytest.mark.parametrize("kind", ["pipe", "file"])
def test_a_non_socket_descriptor_is_a_handoff_error_not_an_oserror(kind):
    # Regression: socket.socket(fileno=<pipe>) raised OSError(ENOTSOCK), which
    # the broker took for a failure of the link and stopped the whole run.
    helper_end, broker_end = handoff.link()
    descriptors = Descriptors()
    try:
        send(helper_end, b"CH", [descriptors.make(kind)])
        with pytest.raises(handoff.HandoffError, match="not a socket"):
            handoff.receive(broker_end)
    finally:
        descriptors.close()
        helper_end.close()
        broker_end.close()


def test_oversized_and_overfull_messages_are_refused_and_closed():
    helper_end, broker_end = handoff.link()
    descriptors = Descriptors()
    try:
        before = open_fds()
        send(helper_end, b"CH" + b"x" * 60000, [descriptors.make("tcp-connected")])
        with pytest.raises(handoff.HandoffError, match="truncated"):
            handoff.receive(broker_end)
        # More descriptors than the broker makes room for: the kernel drops the
        # rest (MSG_CTRUNC) and the broker closes the ones it got.
        send(helper_end, b"CH", [descriptors.make("tcp-connected") for _ in range(20)])
        with pytest.raises(handoff.HandoffError):
            handoff.receive(broker_end)
        assert open_fds() == before + len(descriptors.peers)
    finally:
        descriptors.close()
        helper_end.close()
        broker_end.close()


# --- the whole broker keeps serving after a hostile helper's messages ---------

@pytest.mark.usefixtures("origins_on_loopback")     # its echo server is on this machine's loopback
def test_the_broker_survives_every_bad_message_and_serves_the_next_connection(run_broker):
    echo = EchoServer()
    b = run_broker()
    descriptors = Descriptors()
    try:
        with b.connect("socks") as first:      # settles the broker's own descriptors
            socks_connect(first, 1, socket.inet_aton("127.0.0.1"), echo.port)
            first.sendall(b"x")
            assert first.recv(1) == b"x"
        before = open_fds()
        for message, kinds in [(b"junk", []), (b"CH", []), (b"CQ", ["tcp-connected"]),
                               (b"CH", ["pipe"]), (b"CS", ["unix"]), (b"CH", ["file"]),
                               (b"CS", ["udp"]), (b"CH", ["tcp-connected"] * 3),
                               (b"CH" * 5000, ["tcp-connected"]), (b"", ["pipe"]),
                               (b"CH", ["tcp-unconnected"]), (b"CH", ["tcp-listening"]),
                               (b"LS", ["tcp-connected"]), (b"LH", ["udp"]), (b"LH", ["pipe"])]:
            send(b.helper_end, message, [descriptors.make(k) for k in kinds])
        with b.connect("socks") as c:
            assert socks_connect(c, 1, socket.inet_aton("127.0.0.1"), echo.port)[1] == 0
            c.sendall(b"still served")
            got = b""
            while len(got) < len(b"still served"):
                got += c.recv(100)
            assert got == b"still served"
        b.finish()
        assert b.result == 0
        # Nothing the hostile messages carried stayed open in the broker.
        assert open_fds() <= before + len(descriptors.peers)
        opened = [e for e in b.of("conn.open")]
        assert len(opened) == 2
    finally:
        descriptors.close()
        echo.close()


@pytest.mark.usefixtures("origins_on_loopback")     # its echo server is on this machine's loopback
def test_connections_waiting_for_their_request_are_capped(run_broker, monkeypatch):
    from stages.broker import loop
    monkeypatch.setattr(loop, "MAX_PENDING_HANDSHAKES", 4)
    echo = EchoServer()
    b = run_broker()
    stalled = [b.connect("socks") for _ in range(4)]
    for s in stalled:
        s.sendall(b"\x05")          # one byte of a greeting, then nothing
    try:
        refused = b.connect("socks")
        refused.settimeout(20)
        assert refused.recv(10) == b""      # closed at once, not after the handshake timeout
        refused.close()
        # A stalled client that finishes its request frees a place.
        stalled[0].sendall(b"\x01\x00")
        assert stalled[0].recv(2) == b"\x05\x00"
        stalled[0].sendall(b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1") + echo.port.to_bytes(2, "big"))
        assert stalled[0].recv(10)[1] == 0
        with b.connect("socks") as later:
            assert socks_connect(later, 1, socket.inet_aton("127.0.0.1"), echo.port)[1] == 0
    finally:
        for s in stalled:
            s.close()
        echo.close()
    b.finish()
    fails = b.of("conn.fail")
    assert any(f["fields"]["error"] == "refused" and f["fields"]["stage"] == "handshake"
               and "waiting to send" in f["fields"]["reason"] for f in fails), fails
    assert len(b.of("conn.open")) == 2

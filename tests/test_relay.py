"""The splice relay: byte-exact both ways, half-close, backpressure, fallback."""
from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading

import pytest

from stages.broker import relay as relay_module
from stages.broker.relay import Relay

CHUNK = os.urandom(1 << 20)


def _tcp_pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    return a, b


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock
    sock.close()


def _send(sock: socket.socket, size: int, seed: int) -> str:
    """Send `size` pseudo-random bytes, then shut down writing; their sha256."""
    digest = hashlib.sha256()
    left, offset = size, seed % len(CHUNK)
    while left:
        piece = CHUNK[offset:offset + min(left, 256 * 1024)] or CHUNK[:min(left, 256 * 1024)]
        sock.sendall(piece)
        digest.update(piece)
        left -= len(piece)
        offset = (offset + len(piece)) % len(CHUNK)
    sock.shutdown(socket.SHUT_WR)
    return digest.hexdigest()


def _receive(sock: socket.socket) -> tuple[int, str]:
    digest, total = hashlib.sha256(), 0
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return total, digest.hexdigest()
        digest.update(data)
        total += len(data)


def _run_both_ways(listener, up_size: int, down_size: int, *, use_splice: bool = True):
    client, relay_client_side = _tcp_pair(listener)
    relay_upstream_side, server = _tcp_pair(listener)
    results = {}

    def side(name, sock, size, seed):
        sent = {}
        t = threading.Thread(target=lambda: sent.update(h=_send(sock, size, seed)))
        t.start()
        results[name] = _receive(sock)
        t.join()
        results[name + "_sent"] = sent["h"]

    async def main():
        r = Relay(relay_client_side, relay_upstream_side)
        if not use_splice:
            r.up._use_fallback()
            r.down._use_fallback()
        r.start()
        loop = asyncio.get_running_loop()
        a = loop.run_in_executor(None, side, "client", client, up_size, 1)
        b = loop.run_in_executor(None, side, "server", server, down_size, 2)
        await asyncio.gather(a, b)
        await r.wait()
        return r

    made = []
    real_new_pipe = relay_module._new_pipe

    def counted_new_pipe():
        made.append(1)
        return real_new_pipe()
    relay_module._new_pipe = counted_new_pipe
    try:
        r = asyncio.run(main())
    finally:
        relay_module._new_pipe = real_new_pipe
        client.close()
        server.close()
    # A direction splices (makes its pipe) only once it has copied COPY_FIRST bytes.
    if use_splice:
        assert len(made) == sum(size >= relay_module.COPY_FIRST for size in (up_size, down_size))
    assert results["server"] == (up_size, results["client_sent"])
    assert results["client"] == (down_size, results["server_sent"])
    assert (r.bytes_up, r.bytes_down) == (up_size, down_size)
    assert r.error is None
    # The relay closed its sockets once both directions ended.
    assert relay_client_side.fileno() == -1 and relay_upstream_side.fileno() == -1


@pytest.mark.parametrize("up_size,down_size", [
    (0, 0), (1, 0), (0, 1), (65537, 3), (1 << 20, 1 << 20), (8 << 20, 123457), (64 << 20, 1),
    (relay_module.COPY_FIRST, relay_module.COPY_FIRST + 1),
])
def test_relay_is_byte_exact_both_ways(listener, up_size, down_size):
    _run_both_ways(listener, up_size, down_size)


@pytest.mark.parametrize("size", [0, 5, 3 << 20])
def test_fallback_copy_is_byte_exact(listener, size):
    _run_both_ways(listener, size, size // 3, use_splice=False)


def test_half_close_keeps_the_other_direction_open(listener):
    """Client finishes sending first; the server answers after seeing EOF,
    and the client still gets every byte of the answer."""
    client, a = _tcp_pair(listener)
    b, server = _tcp_pair(listener)
    got = {}

    def server_side():
        got["request"] = _receive(server)           # until the client's EOF
        server.sendall(b"answer after eof" * 1000)
        server.shutdown(socket.SHUT_WR)

    async def main():
        r = Relay(a, b).start()
        loop = asyncio.get_running_loop()
        s = loop.run_in_executor(None, server_side)
        await loop.run_in_executor(None, lambda: (client.sendall(b"x" * 100000),
                                                  client.shutdown(socket.SHUT_WR)))
        got["answer"] = await loop.run_in_executor(None, _receive, client)
        await s
        await r.wait()
        return r

    r = asyncio.run(main())
    assert got["request"] == (100000, hashlib.sha256(b"x" * 100000).hexdigest())
    assert got["answer"][0] == 16000
    assert (r.bytes_up, r.bytes_down) == (100000, 16000)
    client.close()
    server.close()


def test_half_close_from_the_server_side(listener):
    client, a = _tcp_pair(listener)
    b, server = _tcp_pair(listener)

    async def main():
        r = Relay(a, b).start()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: (server.sendall(b"hello"), server.shutdown(socket.SHUT_WR)))
        first = await loop.run_in_executor(None, _receive, client)   # EOF reaches the client
        await loop.run_in_executor(None, lambda: (client.sendall(b"late reply"), client.shutdown(socket.SHUT_WR)))
        second = await loop.run_in_executor(None, _receive, server)
        await r.wait()
        return first, second

    first, second = asyncio.run(main())
    assert first[0] == 5 and second[0] == len(b"late reply")
    client.close()
    server.close()


def test_slow_reader_stops_reading_instead_of_buffering(listener):
    """While the destination does not read, the relay holds at most one pipe's
    worth and stops reading from the sender (backpressure reaches the sender)."""
    client, a = _tcp_pair(listener)
    b, server = _tcp_pair(listener)
    for s in (client, a, b, server):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    client.setblocking(False)
    state = {}

    async def main():
        r = Relay(a, b).start()
        sent = 0
        stalled = 0
        # Push until the client's own send buffer is full for a while.
        while stalled < 50:
            try:
                sent += client.send(CHUNK[:65536])
                stalled = 0
            except BlockingIOError:
                stalled += 1
                await asyncio.sleep(0.005)
        state["sent"] = sent
        state["pending"] = r.up.pending
        state["capacity"] = r.up.capacity
        state["reading"] = r.up.reading
        r.abort()
        await r.wait()

    asyncio.run(main())
    assert state["reading"] is False
    assert 0 < state["pending"] <= state["capacity"]
    # Everything sent is accounted for by kernel buffers, not by Python memory.
    assert state["sent"] < 64 << 20
    client.close()
    server.close()


def test_pipe_size_is_raised():
    r, w, size = relay_module._new_pipe()
    os.close(r)
    os.close(w)
    assert size >= 65536


# --- BodyCopy: exactly n bytes, the sockets left open ---------------------------------------

@pytest.mark.parametrize("use_splice", [True, False], ids=["splice", "fallback"])
@pytest.mark.parametrize("sizes", [[1], [65537, 1, 3 << 20], [(8 << 20) + 3]])
def test_body_copy_moves_exactly_n_bytes_and_leaves_the_rest(listener, sizes, use_splice):
    """Bodies back to back, each followed by bytes that are not the copy's
    (the next head): each copy moves its n bytes and not one more, through one
    pipe reused, and both sockets stay open for the parser."""
    client, a = _tcp_pair(listener)
    b, server = _tcp_pair(listener)
    bodies = [os.urandom(n) for n in sizes]
    stream = b"".join(body + b"NEXT" for body in bodies)
    got = {}
    reader = threading.Thread(target=lambda: got.update(server=_receive(server)))
    reader.start()

    async def main():
        from stages.broker.relay import BodyCopy
        a.setblocking(False)
        b.setblocking(False)
        copier = BodyCopy(a, b)
        if not use_splice:
            copier.way._use_fallback()
        loop = asyncio.get_running_loop()
        sender = loop.run_in_executor(None, client.sendall, stream)
        for body in bodies:
            assert await copier.copy(len(body)) == len(body)
            # What follows the body waits in the socket, untouched.
            tail = b""
            while len(tail) < 4:
                tail += await loop.sock_recv(a, 4 - len(tail))
            assert tail == b"NEXT"
        await sender
        got["bytes"] = copier.bytes
        copier.close()
        b.shutdown(socket.SHUT_WR)

    asyncio.run(main())
    reader.join()
    assert got["bytes"] == sum(sizes)
    assert got["server"] == (sum(sizes), hashlib.sha256(b"".join(bodies)).hexdigest())
    assert a.fileno() != -1 and b.fileno() != -1
    for s in (client, a, b, server):
        s.close()


def test_body_copy_cut_short_is_an_error_and_counts_what_it_moved(listener):
    client, a = _tcp_pair(listener)
    b, server = _tcp_pair(listener)
    client.sendall(b"x" * 70000)
    client.shutdown(socket.SHUT_WR)
    got = {}

    async def main():
        from stages.broker.relay import BodyCopy
        a.setblocking(False)
        b.setblocking(False)
        copier = BodyCopy(a, b)
        with pytest.raises(ConnectionResetError):
            await copier.copy(100000)
        got["bytes"] = copier.bytes
        # The stream is mid-body: the copier refuses to go on.
        with pytest.raises(ConnectionResetError):
            await copier.copy(10)
        copier.close()
        b.shutdown(socket.SHUT_WR)

    asyncio.run(main())
    assert got["bytes"] == 70000
    assert _receive(server)[0] == 70000
    for s in (client, a, b, server):
        s.close()

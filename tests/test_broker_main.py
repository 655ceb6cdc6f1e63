"""`python -m stages.broker` on its own: events on stdout, status on stderr,
SIGTERM ends the run like the helper going away."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile

from stages.wire import handoff
from stages.record.events import parse_line
from broker_support import BROKER_REACHING_LOOPBACK   # its origins listen on the machine's loopback


def test_standalone_broker_relays_and_stops_on_sigterm(tmp_path):
    helper_end, broker_end = handoff.link()
    proc = subprocess.Popen([sys.executable, *BROKER_REACHING_LOOPBACK, "--handoff-fd", str(broker_end.fileno()),
                             "--grace", "0.2", "--run-id", "r-main"],
                            pass_fds=[broker_end.fileno()], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    broker_end.close()
    door = socket.socket()
    door.bind(("127.0.0.1", 0))
    door.listen()
    echo = socket.socket()
    echo.bind(("127.0.0.1", 0))
    echo.listen()
    try:
        client = socket.create_connection(door.getsockname(), timeout=20)
        accepted, _ = door.accept()
        handoff.send_conn(helper_end, "http", accepted.fileno())
        accepted.close()
        client.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % echo.getsockname()[1])
        assert client.recv(100).startswith(b"HTTP/1.1 200")
        server, _ = echo.accept()
        client.sendall(b"abc")
        assert server.recv(10) == b"abc"
        proc.send_signal(signal.SIGTERM)        # the tunnel is still open
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert client.recv(10) == b""               # closed after the grace period
    events = [parse_line(line) for line in out.splitlines()]
    assert [e["type"] for e in events] == ["path.check", "conn.request", "policy.allow", "conn.open", "conn.close"]
    assert all(e["run"] == "r-main" for e in events)
    status = [json.loads(line) for line in err.splitlines() if line.startswith(b"{")]
    assert "path_ok" in status[0]
    assert status[-1] == {"totals": {"connections": 1, "denied": 0, "would_deny": 0, "failed": 0}}
    for s in (client, server, echo, door, helper_end):
        s.close()


def test_standalone_broker_refuses_a_bad_policy(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text("version = 1\n[policy]\nallow = [\"*\"]\n")
    helper_end, broker_end = handoff.link()
    proc = subprocess.run([sys.executable, *BROKER_REACHING_LOOPBACK, "--handoff-fd", str(broker_end.fileno()),
                           "--policy", str(bad)], pass_fds=[broker_end.fileno()], capture_output=True, timeout=30)
    assert proc.returncode == 121
    assert str(bad) in proc.stderr.decode()
    helper_end.close()
    broker_end.close()


def test_a_program_that_exhausts_the_brokers_descriptors_is_waited_out_not_spun_on():
    # The program may hold as many connections as it likes. When the broker
    # runs out of descriptors, accept(2) fails with EMFILE while the door
    # stays readable: the broker must say so once, stop looking at the door
    # for a moment (not spin on it), and serve again once connections close.
    import os
    import resource
    import time
    limit = 48

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    helper_end, broker_end = handoff.link()
    events = tempfile.TemporaryFile()      # the record, read at the end (a pipe nobody reads would fill)
    door = socket.socket()
    door.bind(("127.0.0.1", 0))
    door.listen(512)
    echo = socket.socket()
    echo.bind(("127.0.0.1", 0))
    echo.listen(512)
    proc = subprocess.Popen([sys.executable, *BROKER_REACHING_LOOPBACK, "--handoff-fd", str(broker_end.fileno()),
                             "--grace", "0.2", "--run-id", "r-emfile"], preexec_fn=low_limit,
                            env={**os.environ, "VPNW_BROKER_WORKERS": "1"},
                            pass_fds=[broker_end.fileno()], stdout=events, stderr=subprocess.PIPE)
    broker_end.close()
    handoff.send_door(helper_end, "http", door.fileno())
    request = b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % echo.getsockname()[1]
    held, accepted = [], []
    try:
        for _ in range(limit * 2):      # more tunnels than the broker has descriptors for
            c = socket.create_connection(door.getsockname(), timeout=20)
            c.sendall(request)
            held.append(c)
        deadline = time.monotonic() + 20
        echo.setblocking(False)
        while time.monotonic() < deadline:
            try:
                accepted.append(echo.accept()[0])
            except BlockingIOError:
                if len(accepted) >= limit // 4:
                    break
                time.sleep(0.05)
        assert limit // 4 <= len(accepted) < limit, len(accepted)   # some served, then out of descriptors

        def cpu() -> float:
            fields = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        before = cpu()
        time.sleep(1.0)
        assert cpu() - before < 0.3, "the broker spins on a door it cannot accept on"
        for s in held + accepted:
            s.close()
        held, accepted = [], []
        # The tunnels still waiting in the backlog are accepted and dialled
        # now; their server ends close too, so each ends both ways.
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 1.0:
            try:
                echo.accept()[0].close()
                quiet_since = time.monotonic()
            except BlockingIOError:
                time.sleep(0.02)
        echo.setblocking(True)
        echo.settimeout(20)
        with socket.create_connection(door.getsockname(), timeout=20) as late:
            late.sendall(request)
            assert late.recv(100).startswith(b"HTTP/1.1 200")
            server, _ = echo.accept()
            late.sendall(b"still served")
            assert server.recv(100) == b"still served"
            server.close()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        for s in held + accepted:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert err.decode().count("cannot accept on the http door") == 1, err
    events.seek(0)
    recorded = [parse_line(line) for line in events]
    events.close()
    # Every connection the broker took ends in the record (the ones it could
    # not dial, out of descriptors itself, as failures).
    requests = {e["conn"] for e in recorded if e["type"] == "conn.request"}
    ended = {e["conn"] for e in recorded if e["type"] in ("conn.close", "conn.fail")}
    assert requests and requests == ended
    assert {e["fields"]["reason"] for e in recorded if e["type"] == "conn.fail"} <= {
        "vpnw could not open a socket for it: Too many open files"}
    for s in (door, echo, helper_end):
        s.close()

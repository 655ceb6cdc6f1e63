"""`python -m stages.broker` on its own: events on stdout, status on stderr,
SIGTERM ends the run like the helper going away."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

from stages import handoff
from stages.record import parse_line


def test_standalone_broker_relays_and_stops_on_sigterm(tmp_path):
    helper_end, broker_end = handoff.link()
    proc = subprocess.Popen([sys.executable, "-m", "stages.broker", "--handoff-fd", str(broker_end.fileno()),
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
    proc = subprocess.run([sys.executable, "-m", "stages.broker", "--handoff-fd", str(broker_end.fileno()),
                           "--policy", str(bad)], pass_fds=[broker_end.fileno()], capture_output=True, timeout=30)
    assert proc.returncode == 121
    assert str(bad) in proc.stderr.decode()
    helper_end.close()
    broker_end.close()

"""How many broker processes serve a run, and the connection numbers they
share (the workers themselves are tested through vpnw: test_e2e_load.py)."""
from __future__ import annotations

import os

from stages.broker.workers import MAX_WORKERS, SharedConnNumbers, worker_count
from stages.config.paths import DIRECT
from broker_support import BROKER_REACHING_LOOPBACK   # its origins listen on the machine's loopback


class _Proxy:
    type = "socks5"
    name = "office"


def test_one_process_per_core_on_the_direct_path_and_one_elsewhere(monkeypatch):
    monkeypatch.delenv("VPNW_BROKER_WORKERS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert worker_count(DIRECT) == (max(1, min(cores, MAX_WORKERS)), False)
    assert worker_count(None) == worker_count(DIRECT)
    assert worker_count(_Proxy()) == (1, False)


def test_the_environment_sets_the_count_and_starts_them_at_once(monkeypatch):
    monkeypatch.setenv("VPNW_BROKER_WORKERS", "3")
    assert worker_count(DIRECT) == (3, True)
    monkeypatch.setenv("VPNW_BROKER_WORKERS", "99")
    assert worker_count(DIRECT) == (MAX_WORKERS, True)
    assert worker_count(_Proxy()) == (1, False)      # never for a path that holds state
    for junk in ("0", "-1", "two", ""):
        monkeypatch.setenv("VPNW_BROKER_WORKERS", junk)
        assert worker_count(DIRECT)[1] is False


def test_shared_numbers_are_unique_and_dense_across_processes(tmp_path):
    numbers = SharedConnNumbers()
    pids = []
    for k in range(3):
        pid = os.fork()
        if pid == 0:
            try:
                (tmp_path / str(k)).write_text(" ".join(str(numbers.next()) for _ in range(2000)))
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    got = [int(n) for k in range(3) for n in (tmp_path / str(k)).read_text().split()]
    assert sorted(got) == list(range(1, 6001))
    assert numbers.next() == 6001


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _tunnels(door: tuple, target: int, count: int) -> None:
    """`count` CONNECT tunnels opened together, each answered, then closed."""
    import socket
    clients = [socket.create_connection(door, timeout=20) for _ in range(count)]
    for c in clients:
        c.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % target)
    for c in clients:
        assert c.recv(100).startswith(b"HTTP/1.1 200")
        c.close()


def test_workers_are_forked_only_when_the_lead_sees_load():
    # A run that makes a few connections forks no worker: nothing stands
    # between its first connection and the answer but the loop's load (a
    # worker forked before the loop ran cost that connection the fork).
    # A burst (LOAD_PER_TICK within one LOAD_TICK) forks them from the
    # running loop; they take their share, and the record numbers every
    # connection once.
    import json
    import signal
    import socket
    import subprocess
    import sys
    import tempfile
    import threading
    import time

    import pytest

    from stages.wire import handoff
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: the broker has no workers")
    helper_end, broker_end = handoff.link()
    env = {k: v for k, v in os.environ.items() if k != "VPNW_BROKER_WORKERS"}
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()   # a pipe nobody reads would fill
    proc = subprocess.Popen([sys.executable, *BROKER_REACHING_LOOPBACK, "--handoff-fd", str(broker_end.fileno()),
                             "--grace", "0.5", "--run-id", "r-crew"], env=env,
                            pass_fds=[broker_end.fileno()], stdout=out, stderr=err)
    broker_end.close()
    door, target = socket.socket(), socket.socket()
    for s in (door, target):
        s.bind(("127.0.0.1", 0))
        s.listen(1024)

    def serve_target():                 # every tunnel's far end: accepted and closed
        while True:
            try:
                target.accept()[0].close()
            except OSError:
                return
    threading.Thread(target=serve_target, daemon=True).start()
    try:
        handoff.send_door(helper_end, "http", door.fileno())
        _tunnels(door.getsockname(), target.getsockname()[1], 1)
        _tunnels(door.getsockname(), target.getsockname()[1], 3)
        assert _children(proc.pid) == []            # a few connections: the lead alone
        _tunnels(door.getsockname(), target.getsockname()[1], 200)
        deadline = time.monotonic() + 20
        while not _children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_children(proc.pid)) == workers_wanted() - 1
        for _ in range(5):
            _tunnels(door.getsockname(), target.getsockname()[1], 100)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        target.close()
    out.seek(0)
    err.seek(0)
    out, err = out.read(), err.read()
    assert proc.returncode == 0, err.decode()[-2000:]
    events = [json.loads(line) for line in out.splitlines()]
    opened = [e for e in events if e["type"] == "conn.open"]
    assert sorted(e["conn"] for e in opened) == list(range(1, 705))
    assert len({e["pid"] for e in opened}) >= 2      # the workers served some
    status = [json.loads(line) for line in err.splitlines() if line.startswith(b"{")]
    assert status[-1]["totals"]["connections"] == 704
    for s in (door, helper_end):
        s.close()


def workers_wanted() -> int:
    return worker_count(DIRECT)[0]


def _timeslices(pid: int) -> int:
    """How many times the process's threads have been put on a CPU (schedstat's third field)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[2])
    return total


def test_an_idle_lead_is_not_woken_by_its_load_watch():
    # The lead looks at its load only while connections come: a broker with
    # doors and no connections (most of an agent's run) sleeps. Its load
    # watch used to be a timer for the whole run, 20 wake-ups a second
    # (about 2.5 ms of CPU a second, vpnw's whole idle cost). After a few
    # connections it goes quiet again.
    import signal
    import socket
    import subprocess
    import sys
    import time

    import pytest

    from stages.wire import handoff
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: the broker has no workers and no load watch")
    helper_end, broker_end = handoff.link()
    env = {k: v for k, v in os.environ.items() if k != "VPNW_BROKER_WORKERS"}
    proc = subprocess.Popen([sys.executable, *BROKER_REACHING_LOOPBACK, "--handoff-fd", str(broker_end.fileno()),
                             "--grace", "0.5", "--run-id", "r-idle"], env=env, pass_fds=[broker_end.fileno()],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    broker_end.close()
    door, target = socket.socket(), socket.socket()
    for s in (door, target):
        s.bind(("127.0.0.1", 0))
        s.listen(64)
    try:
        handoff.send_door(helper_end, "http", door.fileno())
        c = socket.create_connection(door.getsockname(), timeout=20)   # the loop is up once it answers
        c.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % target.getsockname()[1])
        assert c.recv(100).startswith(b"HTTP/1.1 200")
        target.accept()[0].close()
        c.close()
        for _ in range(2):
            time.sleep(0.5)                           # the connection's own work and last look done
            before = _timeslices(proc.pid)
            time.sleep(2.0)
            woken = _timeslices(proc.pid) - before
            assert proc.poll() is None
            # A 50 ms timer is about 40 wake-ups in 2 s, even on a loaded machine.
            assert woken <= 6, f"the idle broker was put on a CPU {woken} times in 2 s"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        for s in (door, target, helper_end):
            s.close()

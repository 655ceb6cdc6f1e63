"""vpnw's wait without the selectors module (stages/orchestrator/fd_wait.py):
on real pipes, a pidfd and a signal, ReadWait reports what
selectors.DefaultSelector reports (data ready, a hang-up, a child's exit,
the signal's wake-up byte; nothing once the timeout passes), and refuses
what it does not do. A real run's vpnw never imports selectors; the audit
sees the import of fd_wait, made where selectors' was."""
from __future__ import annotations

import os
import selectors
import signal

import pytest

from e2e_support import audited_run
from startup_support import needs_the_tricks

from stages.orchestrator import fd_wait


def _ready(sel, timeout=0):
    return sorted((key.data, events) for key, events in sel.select(timeout))


@pytest.fixture
def pipes():
    made = [os.pipe() for _ in range(3)]
    yield made
    for r, w in made:
        for fd in (r, w):
            try:
                os.close(fd)
            except OSError:
                pass


def _both():
    return fd_wait.ReadWait(), selectors.DefaultSelector()


def test_it_reports_what_selectors_reports_for_data_hang_ups_and_a_childs_exit(pipes):
    (r1, w1), (r2, w2), (r3, _w3) = pipes
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    pidfd = os.pidfd_open(pid)
    try:
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)    # gone, not reaped yet
        os.write(w1, b"x")
        os.close(w2)
        results = []
        for sel in _both():
            for fd, name in ((r1, "data"), (r2, "hung up"), (r3, "quiet"), (pidfd, "child")):
                assert sel.register(fd, selectors.EVENT_READ, name).fd == fd
            first = _ready(sel, 5)
            assert sel.unregister(r1).data == "data"
            results.append((first, _ready(sel, 0)))
            sel.close()
        assert results[0] == results[1] == ([("child", 1), ("data", 1), ("hung up", 1)],
                                            [("child", 1), ("hung up", 1)])
    finally:
        os.waitpid(pid, 0)
        os.close(pidfd)


def test_nothing_ready_is_an_empty_list_once_the_timeout_passes(pipes):
    for sel in _both():
        sel.register(pipes[0][0], selectors.EVENT_READ, "quiet")
        assert sel.select(0) == [] and sel.select(0.002) == []
        sel.close()


def test_a_signal_wakes_it_through_the_wakeup_fd_as_it_wakes_selectors(pipes):
    wake_r, wake_w = pipes[0]
    os.set_blocking(wake_w, False)
    caught = []
    old = signal.signal(signal.SIGUSR1, lambda *_: caught.append(1))
    old_wakeup = signal.set_wakeup_fd(wake_w)
    try:
        for sel in _both():
            sel.register(wake_r, selectors.EVENT_READ, "signal")
            os.kill(os.getpid(), signal.SIGUSR1)
            assert _ready(sel, 5) == [("signal", 1)]
            os.read(wake_r, 512)
            sel.close()
        assert caught == [1, 1]
    finally:
        signal.set_wakeup_fd(old_wakeup)
        signal.signal(signal.SIGUSR1, old)


def test_it_refuses_what_it_does_not_do(pipes):
    (r1, w1), (r2, _w2), _ = pipes
    sel = fd_wait.ReadWait()
    sel.register(r1, selectors.EVENT_READ, "a")
    with pytest.raises(KeyError):
        sel.register(r1, selectors.EVENT_READ, "again")
    with pytest.raises(ValueError):
        sel.register(w1, selectors.EVENT_WRITE, "writes")
    with pytest.raises(KeyError):
        sel.unregister(r2)
    os.close(r1)                     # closed before its unregister: as selectors, no error
    assert sel.unregister(r1).data == "a"
    sel.close()


@pytest.mark.world
@needs_the_tricks     # with them off vpnw imports socket (and selectors) before the helper's fork
def test_a_runs_vpnw_never_imports_selectors(world, user):
    work = world.workdir(user)
    at, imported = audited_run(world, user, work,
                               ["run", "--record", str(work / "run.jsonl"), "--", "true"],
                               tag="-fd-wait")
    vpnw_pid = at[("vpnw", "helper forked")][1]
    assert at[("vpnw", "go")][0] < at[("vpnw", "run.end sent")][0]
    by_vpnw = {name for _, pid, name in imported if pid == vpnw_pid}
    assert "stages.orchestrator.fd_wait" in by_vpnw     # control: the audit sees the wait's import
    assert "selectors" not in by_vpnw

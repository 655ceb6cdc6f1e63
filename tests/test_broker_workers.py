"""How many broker processes serve a run, and the connection numbers they
share (the workers themselves are tested through vpnw: test_e2e_load.py)."""
from __future__ import annotations

import os

from stages.broker.workers import MAX_WORKERS, SharedConnNumbers, worker_count
from stages.config.paths import DIRECT


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

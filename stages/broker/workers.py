"""More than one broker process on a machine with the cores.

A proxy's work per connection is mostly the kernel's (connect, send, close on
two TCP connections) and one process can only spend one core on it. So the
broker (the lead) forks workers, each a whole broker of its own: its own
loop, its own copy of the policy and the path, its own batches of events into
the shared event pipe (each write at most PIPE_BUF, so lines never tear).
They all accept on the same doors: the lead passes each door the helper
hands it on to every worker, over a handoff link of the worker's own, in the
same protocol (handoff.py). Whichever process is free takes the next
connection.

Workers are forked only when the lead sees load (LOAD_PER_TICK connections
within one LOAD_TICK), from the lead's running loop: its modules are loaded
(their pages stay shared) and a run that makes a few connections, which is
most runs, never forks at all, so nothing stands between the program's first
connection and its answer but the loop's own load (a fork before the loop
ran cost that connection the fork and the lead the copies of every page it
touched next). A worker forked from a running loop takes nothing of it: it
closes every descriptor the lead had (the loop's epoll among them) but its
own and `keep`, stops the lead's signal wake-up, keeps every inherited object
out of the collector's sight (an object collected here could close a
descriptor number that is by then one of its own), and runs a loop of its
own (asyncio sees no running loop in a forked child). The lead forks only
while no name lookup thread is inside getaddrinfo (connector.LookupThreads:
such a thread may hold the C library's locks, held for good in the child).

What the processes share is kept to two things:
- connection numbers, from one counter in shared memory under a lock, so the
  record numbers connections 1, 2, 3... in the order they came, as with one
  process;
- the end: the lead closes the workers' links when its own run ends (the
  helper gone, or SIGTERM); each worker winds down like a broker whose helper
  went away and reports its totals on a status pipe of its own, and the lead
  adds them to its own before it reports.

Only the direct path has workers: the other paths keep state of their own
(a proxy's login, a WireGuard tunnel) that one process should hold.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import select
import signal
import socket
import struct
import time

from stages.config.environment import EnvironmentProblem, broker_workers
from stages.kernel.descriptors import close_all_but
from stages.startup import collector
from stages.wire import status as st
from stages.wire.exits import ExitCode
from stages.wire.handoff import link, send_door

MAX_WORKERS = 4
LOAD_TICK = 0.05           # seconds between the lead's looks at its load
LOAD_PER_TICK = 32         # connections taken within one tick that wake the workers (640/s)


def worker_count(path) -> tuple[int, bool]:
    """How many broker processes in all (the lead included) serve this run,
    and whether the workers start at once rather than at the first load.

    VPNW_BROKER_WORKERS sets the count, and then they start at once (the
    benchmarks and tests compare fixed counts); otherwise one per core this
    process may run on, at most MAX_WORKERS, and one for any path but direct."""
    if path is not None and path.type != "direct":
        return 1, False
    try:
        wanted = broker_workers(dict(os.environ))   # the command line refused a bad one
    except EnvironmentProblem:
        wanted = None
    if wanted is not None:
        return min(wanted, MAX_WORKERS), True
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS)), False


class ConnNumbers:
    """Connection numbers for one process: 1, 2, 3..."""

    def __init__(self):
        self.last = 0

    def next(self) -> int:
        self.last += 1
        return self.last


class SharedConnNumbers:
    """Connection numbers shared by the lead and its workers: one counter in
    a shared memory file made before the fork, under a POSIX record lock
    (fcntl; each process's own, and released by the kernel if its holder
    dies, so a killed worker cannot leave the others waiting). Two system
    calls a connection; nothing to import (multiprocessing's lock would cost
    the broker ~9 ms of start-up)."""

    def __init__(self):
        self._fd = os.memfd_create("vpnw-conn-numbers", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, 8)
        self._cell = mmap.mmap(self._fd, 8)     # MAP_SHARED

    @property
    def fd(self) -> int:
        return self._fd

    def next(self) -> int:
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            n = struct.unpack_from("q", self._cell)[0] + 1
            struct.pack_into("q", self._cell, 0, n)
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
        return n


class Crew:
    """The lead's side of its workers: `size` of them, forked by start()."""

    def __init__(self, size: int, body, keep: tuple[int, ...]):
        self.size = size
        self.body = body            # body(link_fd, status_fd) -> exit code, in each worker
        self.keep = keep
        self.links: list[socket.socket] = []
        self.status_fds: list[int] = []
        self.pids: list[int] = []
        self.started = False

    def start(self, doors) -> None:
        """Load: fork the workers now and pass each the doors (door name,
        listening socket) the lead accepts on; later doors follow through
        pass_door. A worker keeps fds 0-2, `keep` and its own two and
        closes every other (a copy of some other process's socket held here
        would keep its peer from ever seeing the end)."""
        if self.started:
            return
        self.started = True
        collector.freeze()      # the policy's index and every module: out of the workers' collections
        for _ in range(self.size):
            lead_end, worker_end = link()
            status_r, status_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                self._be_the_worker(worker_end, status_w)
            worker_end.close()
            os.close(status_w)
            self.links.append(lead_end)
            self.status_fds.append(status_r)
            self.pids.append(pid)
        for door, sock in doors:
            self.pass_door(door, sock)

    def _be_the_worker(self, worker_end: socket.socket, status_w: int) -> None:
        """In the forked child: never returns."""
        code = ExitCode.INTERNAL
        try:
            # The lead's loop wrote signals to a descriptor closed below,
            # whose number a descriptor of this worker's may take next.
            signal.set_wakeup_fd(-1)
            close_all_but({*self.keep, worker_end.fileno(), status_w})
            code = self.body(worker_end.detach(), status_w)
        finally:
            os._exit(code)

    def pass_door(self, door: str, sock: socket.socket) -> None:
        for lead_end in self.links:
            try:
                send_door(lead_end, door, sock.fileno())
            except OSError:
                pass    # that worker is gone; the others and the lead still serve

    def release(self) -> None:
        """The run is over: each worker sees its link end and winds down."""
        for lead_end in self.links:
            lead_end.close()
        self.links = []

    def collect(self, timeout: float) -> tuple[dict, int]:
        """Every worker's totals added up, and how many workers did not
        report them (crashed, or still winding down after `timeout`: those
        are stopped)."""
        readers = {fd: st.StatusReader(fd, st.BROKER_STATUS) for fd in self.status_fds}
        sums = {"connections": 0, "denied": 0, "would_deny": 0, "failed": 0}
        reported = 0
        deadline = time.monotonic() + timeout
        waiting = set(readers)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(list(waiting), [], [], left)
            for fd in ready:
                reader = readers[fd]
                try:
                    reader.feed()
                    while (message := reader.pop()) is not None:
                        if isinstance(message, st.Totals):
                            for key in sums:
                                sums[key] += getattr(message, key)
                            reported += 1
                except st.StatusError:
                    reader.eof = True
                if reader.eof:
                    waiting.discard(fd)
        for pid in self.pids:
            if waiting:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        for fd in self.status_fds:
            os.close(fd)
        missing = len(self.pids) - reported
        self.pids, self.status_fds = [], []
        return sums, missing

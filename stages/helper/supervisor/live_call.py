"""One notified call as the shell reads it from the notifying thread."""
from __future__ import annotations

import errno
import os
import stat

from stages.helper.supervisor import judge
from stages.helper.supervisor.bound import identity
from stages.helper.supervisor.judge import int32, unix_destination
from stages.helper.supervisor.program_paths import open_in_root

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from stages.helper.supervisor.program_threads import Threads


class LiveCall:
    """judge.Call, read from the notifying thread as decide asks for each
    fact, once. The thread group is counted before the socket is taken
    (`sock` asks `alone` first: docs/security.md). `cookie`: the sandbox's
    network namespace's (SO_NETNS_COOKIE); `held`: each fd this opens, for
    the caller to close once the call is answered."""

    def __init__(self, n, threads: Threads, held: list[int], cookie: int):
        self._n, self._threads, self._held, self._cookie = n, threads, held, cookie
        self.nr, self.arch, self.pid = n.nr, n.arch, n.pid
        self.length = int32(n.args[2])
        self._facts: dict[str, object] = {}

    def _fact(self, name: str, make):
        if name not in self._facts:
            self._facts[name] = make()
        return self._facts[name]

    @property
    def alone(self) -> bool:
        return self._fact("alone", lambda: self._threads.alone(self.pid))

    def _take(self):
        self.alone          # noqa: B018 - counted before the take
        try:
            sock = self._threads.take(self.pid, int32(self._n.args[0]))
        except OSError as e:
            return None, e.errno or errno.EBADF
        self._held.append(sock)
        return sock, 0

    @property
    def sock(self) -> int:
        return self._fact("take", self._take)[0]

    @property
    def sock_error(self) -> int:
        return self._fact("take", self._take)[1]

    def _read(self):
        if not self.length:
            return b"", 0
        try:
            return self._threads.memory.read(self.pid, self._n.args[1], self.length), 0
        except OSError as e:
            return b"", e.errno or errno.EFAULT

    @property
    def raw(self) -> bytes:
        return self._fact("raw", self._read)[0]

    @property
    def raw_error(self) -> int:
        return self._fact("raw", self._read)[1]

    def _domain(self):
        try:
            return self._threads.domain(self.sock)
        except OSError:
            return None

    @property
    def domain(self) -> int | None:
        return self._fact("domain", self._domain)

    def _inside(self) -> bool:
        try:
            return self._threads.cookie(self.sock) == self._cookie
        except OSError:
            return False

    @property
    def made_inside(self) -> bool:
        return self._fact("inside", self._inside)

    def _target(self):
        destination = unix_destination(self.raw)
        try:
            fd = open_in_root(self._threads.proc, self.pid, destination.name)
        except OSError as e:
            return judge.ConnectTarget(error=e.errno or errno.ENOENT), None
        self._held.append(fd)
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode):
            return judge.ConnectTarget(socket=False), fd
        return judge.ConnectTarget(socket=True, key=identity(fd, st)), fd

    @property
    def target(self) -> judge.ConnectTarget:
        return self._fact("target", self._target)[0]

    @property
    def target_fd(self) -> int:
        return self._fact("target", self._target)[1]

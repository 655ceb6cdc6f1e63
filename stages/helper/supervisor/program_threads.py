"""The program's threads as the supervisor reaches them: a receiving
thread's kept handles on them (Threads), and what their /proc says (their
thread group, their PID inside the sandbox and their name). `proc` is the
supervisor's /proc, the one from before init mounted the sandbox's."""
from __future__ import annotations

import errno
import os

from stages.helper.supervisor.judge import SOCKADDR_MAX
from stages.kernel import seccomp_notify as sn

# The pidfds (and /proc/TID/task fds) a receiving thread keeps open, by TID
# (its own: no other thread closes them).
KEPT_PER_RECEIVER = 8


def threads_in(task_dir_links: int) -> int:
    """Pure: how many threads the group has, from the link count of its
    /proc/TID/task directory (the kernel's proc_task_getattr adds the group's
    nr_threads to a directory's two; a thread that is gone leaves two)."""
    return task_dir_links - 2


class Threads:
    """One receiving thread's handles on the program's threads, kept by TID:
    a pidfd (PIDFD_THREAD) and an O_PATH fd of /proc/TID/task, so that a
    program that connects again from the same thread costs neither a
    pidfd_open nor an open. Sound because each names one thread for life (a later thread with
    the same TID has another struct pid): when the kept one's thread is gone,
    pidfd_getfd fails (ESRCH, EBADF) and the task directory counts no thread,
    and it is opened again; when they succeed, the thread they named was alive
    with that TID while the notified one was waiting (NOTIF_ID_VALID after
    the take, or the "continue" answer, which the kernel checks against the
    pending notification), so they are the same thread. Only thread pidfds
    are kept (a kernel before 6.9 has none: then one per connect, of the
    thread group)."""

    def __init__(self, proc_fd: int):
        self.pidfds: dict[int, int] = {}
        self.tasks: dict[int, int] = {}
        self.proc = proc_fd
        # This receiving thread's own buffers, made once.
        self.memory = sn.MemoryReader(SOCKADDR_MAX)
        self.domain = sn.DomainReader()
        self.cookie = sn.CookieReader()
        self.has_turn = False       # the supervisor's turn to receive (Supervisor._receive)
        self.notification = bytearray(sn.NOTIF.size)

    def take(self, tid: int, fd: int) -> int:
        """A duplicate of the thread's fd `fd` (pidfd_getfd)."""
        pidfd = self.pidfds.pop(tid, None)
        if pidfd is not None:
            try:
                sock = sn.pidfd_getfd(pidfd, fd)
            except OSError:
                os.close(pidfd)          # gone, or a bad fd: asked again below
            else:
                self.pidfds[tid] = pidfd
                return sock
        try:
            pidfd = sn.pidfd_open(tid, sn.PIDFD_THREAD)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            pidfd = sn.pidfd_open(thread_group(self.proc, tid))   # a kernel before 6.9
            try:
                return sn.pidfd_getfd(pidfd, fd)
            finally:
                os.close(pidfd)
        _keep(self.pidfds, tid, pidfd)
        return sn.pidfd_getfd(pidfd, fd)

    def alone(self, tid: int) -> bool:
        """Is the thread the only one of its thread group? Asked again on
        every call (fstat of its kept /proc/TID/task: the group's
        nr_threads, with no text to make or parse). False when that cannot
        be told."""
        task = self.tasks.pop(tid, None)
        for _ in range(2):
            if task is None:
                try:
                    task = os.open(f"{tid}/task", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC,
                                   dir_fd=self.proc)
                except OSError:
                    return False
            count = threads_in(os.fstat(task).st_nlink)
            if count > 0:
                _keep(self.tasks, tid, task)
                return count == 1
            os.close(task)              # its thread is gone: opened again, by TID
            task = None
        return False


def _keep(kept: dict[int, int], tid: int, fd: int) -> None:
    if len(kept) >= KEPT_PER_RECEIVER:
        os.close(kept.pop(next(iter(kept))))
    kept[tid] = fd


def proc_text(proc: int, tid: int, name: str) -> str:
    fd = os.open(f"{tid}/{name}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    try:
        return os.read(fd, 4096).decode("utf-8", "replace")
    finally:
        os.close(fd)


def thread_group(proc: int, tid: int) -> int:
    for line in proc_text(proc, tid, "status").splitlines():
        if line.startswith("Tgid:"):
            return int(line.split()[1])
    raise OSError(errno.ESRCH, "no Tgid")


def who(proc: int, tid: int) -> tuple[int, str]:
    """The thread's PID as the program sees it (the last NSpid) and its name."""
    try:
        pid = 0
        for line in proc_text(proc, tid, "status").splitlines():
            if line.startswith("NSpid:"):
                pid = int(line.split()[-1])
        return pid, proc_text(proc, tid, "comm").strip()
    except (OSError, ValueError):
        return 0, ""

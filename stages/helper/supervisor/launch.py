"""The supervisor as the helper starts it: whether it can run here
(missing) and which path will answer (answered_by: both for `vpnw
doctor` too), the sockets the policy names (named_sockets), the link the
program's process sends its listener over, and the supervisor's process
(spawn). The helper imports this on its way to Ready; the supervisor's
own machinery (shell.py, seccomp_notify) loads in the supervisor's process
alone, after its fork."""
from __future__ import annotations

import os
import socket
import stat

from stages.helper import seccomp_rules
from stages.helper.supervisor.compiled import PYTHON_ONLY_ENV, compiled_path
from stages.kernel import privileges as priv
from stages.kernel.descriptors import close_all_but
from stages.startup import collector
from stages.startup.records import NamedTuple  # typing's, without importing typing

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Callable

    from stages.helper.supervisor.reports import RefusedLoopbackConnect, Report


class NamedSocket(NamedTuple):
    """A socket the policy's [unix] allow names: its entry as written, and an
    O_PATH fd of the socket file, opened when the run starts."""
    entry: str
    fd: int


def missing() -> str | None:
    """None when this kernel and libseccomp have what the supervisor needs;
    else what is missing (the run then refuses every Unix socket, as before,
    and `vpnw doctor` says why)."""
    try:
        # [1]: the API level, as pyseccomp's get_api() says it
        if seccomp_rules.libseccomp_version()[1] < 5:
            return "libseccomp or the kernel lacks seccomp user notification (API level < 5)"
    except (ImportError, OSError, RuntimeError, AttributeError) as e:
        return f"libseccomp cannot be asked ({e})"
    gap = priv.supervisor_syscalls_missing()
    if gap:
        return f"the kernel lacks {gap}()"
    try:
        release = tuple(int(part) for part in os.uname().release.split("-")[0].split(".")[:2])
    except ValueError:
        release = (0, 0)
    if release < (5, 15):
        return "the kernel lacks SIOCUNIXFILE and SO_NETNS_COOKIE (Linux 5.15)"
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return "/proc is not this PID namespace's"
    except OSError as e:
        return f"/proc cannot be read ({e.strerror})"
    return None


def answered_by() -> str:
    """Which path answers "continue", for `vpnw doctor`."""
    if compiled_path() is not None:
        return "compiled (fast_continue)"
    if os.environ.get(PYTHON_ONLY_ENV):
        return f"Python ({PYTHON_ONLY_ENV} is set)"
    return "Python (the compiled path was not built at install)"


def named_sockets(entries) -> list[NamedSocket]:
    """The policy's [unix] allow entries ((as written, path)) that are sockets
    now, each with an O_PATH fd of its socket file (the supervisor names it
    by its handle: judge.identity_key), whatever path reaches it.
    Opened once: a socket made again later under the same path is another
    socket, and stays refused."""
    named = []
    for entry, path in entries:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            named.append(NamedSocket(entry, fd))
        else:
            os.close(fd)
    return named


class SupervisorLink(NamedTuple):
    """What the helper holds between the fork of init and the program's exec."""
    supervisor_end: socket.socket
    program_end: socket.socket
    proc_fd: int


def link() -> SupervisorLink:
    """Before init's fork (and its /proc mount): the helper's own /proc and
    the pair the program's process sends its listener fd over."""
    proc_fd = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return SupervisorLink(ours, theirs, proc_fd)


def hand_over_listener(program_end: int, seccomp_filter) -> None:
    """In the program's process, before exec: the filter is loaded, and its
    listener goes to the supervisor; no copy stays (a program holding its own
    listener could answer its own connects)."""
    listener = seccomp_rules.load_with_listener(seccomp_filter)
    with socket.socket(fileno=program_end) as sock:
        socket.send_fds(sock, [b"n"], [listener])
    os.close(listener)


def spawn(link_: SupervisorLink, named: list[NamedSocket], status_fd: int,
          report: Callable[[Report | RefusedLoopbackConnect], None], listened: tuple = ()) -> int:
    """In the helper, inside the new user and network namespaces but before
    the new PID namespace: the supervisor process (its PID). Forked there, it
    is out of the program's PID namespace (the program can neither see nor
    signal it), and may start threads (a process whose children go to another
    PID namespace may not). It waits for the listener, answers until no
    process uses the filter, and exits."""
    pid = os.fork()
    if pid:
        link_.supervisor_end.close()
        os.close(link_.proc_fd)
        for entry in named:
            os.close(entry.fd)
        return pid
    code = 1
    try:
        # The helper collects nothing before Ready (main.py); this process
        # lives as long as the program and makes threads and reports: on again
        # (processes.collect_from_now).
        collector.freeze_and_resume()
        priv.prctl(priv.PR_SET_PDEATHSIG, 9)
        link_.program_end.close()
        close_all_but({link_.supervisor_end.fileno(), link_.proc_fd, status_fd,
                       *(entry.fd for entry in named)})
        _serve_when_listened(link_, named, report, listened)
        code = 0
    finally:
        os._exit(code)


def _serve_when_listened(link_: SupervisorLink, named, report, listened: tuple = ()) -> None:
    # The supervisor's own machinery, in its process alone (never the
    # helper's on its way to Ready), and the compiled path: loaded while the
    # program's process still starts, not after.
    from stages.helper.supervisor.shell import Supervisor
    compiled_path()
    with link_.supervisor_end as sock:
        try:
            _msg, fds, _flags, _addr = socket.recv_fds(sock, 1, 1)
        except OSError:
            return
    if not fds:
        return          # the program's process never loaded its filter
    # Up to MAX_BOUND recorded files and KEPT_PER_RECEIVER pidfds and task
    # directories per receiving thread stay open: past a soft limit of
    # 1024, the hard one.
    import resource     # the supervisor's process alone needs it: kept off the helper's start
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        Supervisor(fds[0], link_.proc_fd, named, report, listened).serve()
    finally:
        # Closed, the listener makes every connect still to come fail
        # (ENOSYS): never one that nobody checked.
        os.close(fds[0])

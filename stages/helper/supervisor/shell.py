"""The Unix-socket supervisor: it answers every connect() and listen() the program makes.

The program's seccomp filter sends each connect() and listen() here (SECCOMP_RET_USER_NOTIF);
the program's thread waits until we answer. We take the program's socket
(pidfd_getfd), read its address once, decide on what we read, make the
connect() ourselves on that same socket and answer with its result: were the
kernel to go on with the program's own call (SECCOMP_USER_NOTIF_FLAG_CONTINUE),
another thread could change the fd or the address between our look and the
kernel's. The one exception: an IP socket of a thread alone in its group (no
other task can change its fd table while it waits; the filter refuses a
process that shares it) is let go on. The design, and what a program could
try against it, is in docs/security.md, "Unix sockets by origin".

What is allowed (stages/helper/connect_judge.py decides, on what this reads):
- a socket of another family (TCP, UDP, netlink) made in the sandbox's
  network namespace (SO_NETNS_COOKIE): connected as asked (or let go on);
  the network namespace is that boundary;
- a path whose socket file's identity (its device and file handle) is one
  recorded at a listen() of a Unix socket made in the sandbox (the file its
  bind made, SIOCUNIXFILE), or is a socket the policy's [unix] allow names
  (opened once, when the run starts);
- an abstract name, when the socket was made in the sandbox's network
  namespace (abstract names are per namespace).
A listen() is let go on once its socket's file is recorded. Anything else
gets EPERM, and a UnixRefused status message first (a call the filter
never sends: EPERM alone).

This runs as a process of its own, forked by the helper (P) inside the
sandbox's user, network and mount namespaces but outside its PID namespace
(the program cannot see, signal or trace it), non-dumpable. It resolves paths
in the program's root through the /proc of its own PID namespace, opened
before init mounts the sandbox's over it.
"""
from __future__ import annotations

import errno
import gc
import os
import socket
import stat
import struct
import threading

from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.kernel import unix_diag
from stages.kernel import privileges as priv

# stages/kernel/seccomp_notify.py, the notify calls: loaded by the
# supervisor's process alone (_load_notify), never by the helper on its way
# to Ready, which asks only whether the supervisor can run (missing()).
sn = None


def _load_notify() -> None:
    global sn
    if sn is None:
        from stages.kernel import seccomp_notify
        sn = seccomp_notify

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Callable


from stages.helper import connect_judge as cj
from stages.helper.connect_judge import (AF_UNIX, INET_FAMILIES, SOCKADDR_MAX,  # noqa: F401
                                         UnixDestination, int32, loopback_port, unix_destination)

# One thread at a time receives; it hands that turn to another before a
# connect of its own that may wait (a full backlog), and one more starts when
# no other is parked, up to this many, so such a connect holds only its own
# thread. Past this many, the program only waits on itself.
MOST_RECEIVERS = 32
# The pidfds (and /proc/TID/task fds) a receiving thread keeps open, by TID
# (its own: no other thread closes them).
KEPT_PER_RECEIVER = 8
# What _decide answers when the kernel may go on with the program's own call.
GO_ON = -1
# The compiled "continue" answer (stages/helper/fast_continue.c, built where a
# C compiler and Python's headers were at install); set, the Python path
# answers every notification, as where it did not build (the tests run both).
PYTHON_ONLY_ENV = "VPNW_SUPERVISOR_PYTHON"
# The loopback ports whose refusals are reported (evidence for a hint; the
# rest of a scan adds nothing).
MAX_REFUSED_PORTS = 16


def compiled_path():
    """The compiled fast path's module, or None (not built here, or
    PYTHON_ONLY_ENV set): then the Python path answers everything."""
    if os.environ.get(PYTHON_ONLY_ENV):
        return None
    try:
        from stages.helper import fast_continue
    except ImportError:
        return None
    return fast_continue


def answered_by() -> str:
    """Which path answers "continue", for `vpnw doctor`."""
    if compiled_path() is not None:
        return "compiled (fast_continue)"
    if os.environ.get(PYTHON_ONLY_ENV):
        return f"Python ({PYTHON_ONLY_ENV} is set)"
    return "Python (the compiled path was not built at install)"


def shown(destination: UnixDestination) -> str:
    """The destination as the record shows it: a path, or @name (abstract)."""
    if destination.kind == "abstract":
        return "@" + destination.name[1:].decode("utf-8", "backslashreplace")
    return destination.name.decode("utf-8", "backslashreplace")


def shown_inet(raw: bytes) -> str:
    """An IP sockaddr as the record shows a refused one: ADDRESS:PORT, or
    the family's number for any other."""
    import ipaddress
    family = int.from_bytes(raw[:2], "little") if len(raw) >= 2 else -1
    if family == socket.AF_INET and len(raw) >= 8:
        return f"{ipaddress.IPv4Address(raw[4:8])}:{int.from_bytes(raw[2:4], 'big')}"
    if family == socket.AF_INET6 and len(raw) >= 24:
        return f"[{ipaddress.IPv6Address(raw[8:24])}]:{int.from_bytes(raw[2:4], 'big')}"
    return f"(address family {family})"


# The sockets recorded as bound inside at most (each keeps an O_PATH fd);
# past it those no longer listened on are dropped (sock_diag), and past that
# a new one is not recorded (connects to it are refused).
MAX_BOUND = 1024


class NamedSocket(NamedTuple):
    """A socket the policy's [unix] allow names: its entry as written, and an
    O_PATH fd of the socket file, opened when the run starts."""
    entry: str
    fd: int


def _identity(fd: int, st: os.stat_result | None = None) -> tuple | None:
    """connect_judge.identity_key of the file `fd`."""
    st = st or os.fstat(fd)
    try:
        return cj.identity_key(st.st_dev, st.st_ino, sn.file_handle(fd), 0)
    except OSError:
        pass
    try:
        fs_type = sn.file_system_type(fd)       # asked only without a handle
    except OSError:
        return None                             # unknown: as if its numbers repeat
    return cj.identity_key(st.st_dev, st.st_ino, None, fs_type)


class BoundTable:
    """The recorded identities that have a handle, in a buffer the compiled
    path reads without the GIL (fast_continue.c, `struct slot`): a count of
    slots in use, then MAX_BOUND slots. A slot is written under a sequence
    number, odd while it changes: the reader takes a slot only when the
    number is even and the same before and after its read (a seqlock), so it
    never matches on half a slot. Written under Supervisor.lock only."""
    BOUND, NAMED = 1, 2
    HEAD = struct.Struct("=I4x")
    SEQ = struct.Struct("=I")
    BODY = struct.Struct("=IQiI64s")        # kind, st_dev, handle_type, handle_bytes, f_handle
    SLOT = SEQ.size + BODY.size             # 88
    HANDLE_MAX = 64

    def __init__(self):
        self.data = bytearray(self.HEAD.size + MAX_BOUND * self.SLOT)
        self.used = 0                       # slots ever written (the count at the head)
        self._free_slots: list[int] = []    # of those, cleared since

    @property
    def free(self) -> int:
        return len(self._free_slots) + MAX_BOUND - self.used

    def put(self, kind: int, key: tuple) -> int | None:
        """A slot for ("handle", dev, type, bytes); None when none is free or
        the handle is longer than a slot holds (then only the Python path
        matches it)."""
        _, dev, handle_type, handle = key
        if len(handle) > self.HANDLE_MAX:
            return None
        if self._free_slots:
            slot = self._free_slots.pop()
        elif self.used < MAX_BOUND:
            slot = self.used
        else:
            return None
        self._write(slot, kind, dev, handle_type, handle)
        if slot == self.used:
            self.used += 1
            self.HEAD.pack_into(self.data, 0, self.used)
        return slot

    def clear(self, slot: int) -> None:
        self._write(slot, 0, 0, 0, b"")
        self._free_slots.append(slot)

    def _write(self, slot: int, kind: int, dev: int, handle_type: int, handle: bytes) -> None:
        at = self.HEAD.size + slot * self.SLOT
        seq = self.SEQ.unpack_from(self.data, at)[0]
        self.SEQ.pack_into(self.data, at, (seq + 1) & 0xFFFFFFFF)        # odd: changing
        self.BODY.pack_into(self.data, at + self.SEQ.size, kind, dev, handle_type, len(handle), handle)
        self.SEQ.pack_into(self.data, at, (seq + 2) & 0xFFFFFFFF)        # even: whole again


class LiveCall:
    """connect_judge.Call, read from the notifying thread as decide asks
    for each fact, once. The thread group is counted before the socket is
    taken (`sock` asks `alone` first: docs/security.md)."""

    def __init__(self, supervisor: Supervisor, n, threads: Threads, held: list[int]):
        self._s, self._n, self._threads, self._held = supervisor, n, threads, held
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
            return self._threads.cookie(self.sock) == self._s.cookie
        except OSError:
            return False

    @property
    def made_inside(self) -> bool:
        return self._fact("inside", self._inside)

    def _target(self):
        destination = unix_destination(self.raw)
        try:
            fd = self._s._open_in_root(self.pid, destination.name)
        except OSError as e:
            return cj.Target(error=e.errno or errno.ENOENT), None
        self._held.append(fd)
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode):
            return cj.Target(socket=False), fd
        return cj.Target(socket=True, key=_identity(fd, st)), fd

    @property
    def target(self) -> cj.Target:
        return self._fact("target", self._target)[0]

    @property
    def target_fd(self) -> int:
        return self._fact("target", self._target)[1]


class Report(NamedTuple):
    """One line of the record: a refused connect, or one to a policy-named socket."""
    allowed: bool
    path: str
    process: int          # the PID inside the sandbox (0 if it is gone)
    program: str          # its command name
    reason: str           # why refused / the policy's entry


class RefusedLoopbackConnect(NamedTuple):
    """A TCP connect to a port of the sandbox's own loopback that nothing
    there listens on, which the kernel refuses: the evidence for the closing
    hint that names a `localhost:PORT` rule (stages/recorder/hints.py)."""
    port: int
    process: int
    program: str


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

    def __init__(self, proc_fd: int, thread_group: Callable[[int], int]):
        _load_notify()
        self.pidfds: dict[int, int] = {}
        self.tasks: dict[int, int] = {}
        self.proc = proc_fd
        self.thread_group = thread_group
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
            pidfd = sn.pidfd_open(self.thread_group(tid))   # a kernel before 6.9
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


class Supervisor:
    """The threads over one seccomp listener. `report` is called (and must
    have written the record) before the program is answered."""

    def __init__(self, listener: int, proc_fd: int, named: list[NamedSocket],
                 report: Callable[[Report | RefusedLoopbackConnect], None], listened: tuple = ()):
        _load_notify()
        self.listener = listener
        self.proc = proc_fd
        self._report = report
        self.diag = unix_diag.open_diag()
        # The sandbox's network namespace, by its cookie (SO_NETNS_COOKIE of
        # a socket made here: the supervisor is in it for life).
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as own:
            self.cookie = sn.CookieReader()(own.fileno())
        self.lock = threading.Lock()        # the counts below, the bound sockets
        self.receivers = 0                  # receiving threads started
        self.parked = 0                     # of them, waiting for the turn
        self.turn = threading.Lock()        # held by the one thread that receives
        self.over = False                   # serve() has returned
        self.diag_lock = threading.Lock()   # one dump at a time on the one socket
        self.report_lock = threading.Lock()  # one message at a time on the status pipe
        self.refused_ports: set[int] = set()     # reported (self.lock)
        # The loopback ports seen with a listener inside, a bit each: one
        # table for both paths (the compiled one reads it; only ever set, under self.lock).
        self.listened_bits = bytearray(65536 // 8)
        # The doors' ports (`listened`): the helper listens on them before
        # the program runs (a door it cannot open fails the seal), so their
        # connects go on from the first (the compiled path's "continue"),
        # without this code's sock_diag look (inet_diag and its import,
        # some ms of the program's first connect through a door).
        for port in listened:
            self._listened(port)
        self.fast = compiled_path()
        # The socket files the program's processes bound, by identity
        # (connect_judge.identity_key), recorded as each listens: an O_PATH
        # fd each, kept (its inode, and so its handle, stays theirs), and
        # a slot of the table the compiled path matches against.
        self.bound: dict[tuple, tuple[int, int, int, int | None]] = {}   # key -> (fd, dev, ino, slot)
        self.table = BoundTable()
        # The policy's sockets, by the same identity (their fds were opened
        # when the run started, before the sandbox's mounts).
        self.named: dict[tuple, str] = {}
        for entry in named:
            key = _identity(entry.fd)
            if key is not None:
                self.named[key] = entry.entry
                if key[0] == "handle":
                    self.table.put(BoundTable.NAMED, key)
        self.view = cj.Sandbox(self.listened_bits, self.bound, self.named)

    # ------------------------------------------------------------ threads

    def serve(self) -> None:
        """Answer notifications until no process uses the filter any more. The
        receiving threads answer; this one only waits for the listener's
        hang-up (registered for no event, poll wakes for POLLHUP/POLLERR only)."""
        import select
        # The connects we make name their target as self/fd/N relative to our
        # own /proc (the one from before init's).
        os.fchdir(self.proc)
        sn.wake_up_synchronously(self.listener)
        self.receivers = 1
        self._start_receiver()
        poller = select.poll()
        poller.register(self.listener, 0)
        while not poller.poll():
            pass
        self.over = True

    def _start_receiver(self) -> None:
        threading.Thread(target=self._receive, daemon=True).start()

    def _receive(self) -> None:
        """One thread at a time waits in NOTIF_RECV: the one with the turn.
        It keeps the turn while it answers without waiting on anything (a
        "continue", a refusal, a non-blocking socket's connect), so a
        program's connects are answered by one thread, woken once each.
        Before a blocking socket's connect it makes itself (which may wait on
        a full backlog) it hands the turn over (_hand_over). Only one
        waits in the ioctl because the kernel (6.6+) wakes every thread
        waiting there for each notification, and all but one go back to
        sleep."""
        threads = Threads(self.proc, self._thread_group)
        try:
            while True:
                if not threads.has_turn:
                    with self.lock:
                        self.parked += 1
                    self.turn.acquire()
                    with self.lock:
                        self.parked -= 1
                    threads.has_turn = True
                try:
                    notification = self._next(threads)
                except OSError as e:
                    if e.errno in (errno.EINTR, errno.ENOENT):
                        continue    # the program's call ended before we read it
                    raise
                self._answer(notification, threads)
        except BaseException:  # noqa: BLE001 - a supervisor that cannot answer must end
            if self.over:
                return      # serve() returned: the listener is closed, on purpose
            # The listener closes with us: every connect still to come fails
            # (ENOSYS), never one that nobody checked.
            os._exit(1)

    def _next(self, threads: Threads) -> sn.Notification:
        """The next notification to decide here: the compiled path, where
        there is one, answers first those it decides as this code would (a
        "continue"; a non-blocking IP socket's connect of a thread that is
        not alone; a non-blocking Unix socket's connect to an absolute path
        bound by a listener inside), and returns with the first it does
        not, which is decided from the start here."""
        if self.fast is None:
            return sn.receive(self.listener, threads.notification)
        self.fast.receive(self.listener, self.proc, self.listened_bits, self.table.data,
                          threads.notification, self.cookie)
        return sn.Notification(threads.notification)

    def _hand_over(self, threads: Threads) -> None:
        """Before this thread does what may wait: another takes the turn (one
        more starts when none is parked, up to MOST_RECEIVERS; past that the
        program only waits on itself)."""
        if not threads.has_turn:
            return
        threads.has_turn = False
        with self.lock:
            more = self.parked == 0 and self.receivers < MOST_RECEIVERS
            if more:
                self.receivers += 1
        if more:
            self._start_receiver()
        self.turn.release()

    def _answer(self, n: sn.Notification, threads: Threads) -> None:
        held: list[int] = []
        try:
            result = self._decide(n, threads, held)
        except OSError as e:
            result = e.errno or errno.EPERM
        except Exception:  # noqa: BLE001 - a connect we could not judge is refused
            result = errno.EPERM
        try:
            if result is not None:
                self._respond(n.id, result)
        finally:
            for fd in held:
                os.close(fd)

    def _respond(self, notif_id: int, error: int) -> None:
        try:
            if error == GO_ON:
                sn.go_on(self.listener, notif_id)
            else:
                sn.respond(self.listener, notif_id, error=error)
        except OSError as e:
            if e.errno != errno.ENOENT:     # ENOENT: the program's thread is gone
                raise

    def report(self, report: Report | RefusedLoopbackConnect) -> None:
        with self.report_lock:
            self._report(report)

    # ------------------------------------------------------------ one connect

    def _decide(self, n: sn.Notification, threads: Threads, held: list[int]) -> int | None:
        """None (nobody waits any more), GO_ON, or the errno to answer (0:
        connected), once the connect is made. What to do is connect_judge's
        (pure); this reads what it asks for and does what it says."""
        call = LiveCall(self, n, threads, held)
        answer = cj.decide(call, self.view)
        action = answer.action
        if action == cj.ERRNO:
            return answer.errno
        if action == cj.LISTEN:
            self._record_listener(call)
            return GO_ON
        if action == cj.GO_ON:
            return GO_ON
        if action != cj.REFUSE and os.get_blocking(call.sock):
            # Only a blocking socket's connect can wait (on a full backlog);
            # a non-blocking one (Node, Go, libuv, asyncio) answers at once.
            self._hand_over(threads)
        # The thread still waits: the TID named it all along, so the socket,
        # the bytes and the file its path names came from it.
        if not sn.still_pending(self.listener, n.id):
            return None
        if action == cj.REFUSE:
            self._refuse(n, call.raw, answer.why)
            return errno.EPERM
        if action == cj.CONNECT_TARGET:
            if answer.why:
                self.report(Report(True, shown(unix_destination(call.raw)), *self._who(n.pid),
                                   answer.why))
            # Through the fd we checked, never the path again: what we looked at
            # is what we connect to, whatever the program renames meanwhile.
            return sn.connect_raw(call.sock, AF_UNIX.to_bytes(2, "little")
                                  + f"self/fd/{call.target_fd}".encode())
        result = sn.connect_raw(call.sock, call.raw)
        port = loopback_port(call.raw)
        if port is not None:
            self._at_loopback(n.pid, port, result)
        return result

    def _record_listener(self, call: LiveCall) -> None:
        """A listen(): the file the socket is bound to (SIOCUNIXFILE: the
        inode its bind made, whatever was renamed since) is recorded as
        bound inside, when the socket is a Unix one made in the sandbox's
        network namespace. Anything else is let go on unrecorded: the
        kernel's listen() cannot reach anything."""
        if call.sock_error or call.domain != AF_UNIX or not call.made_inside:
            return
        try:
            fd = sn.unix_file(call.sock)
        except OSError:
            return          # bound to no file (abstract, autobind at listen)
        try:
            st = os.fstat(fd)
            key = _identity(fd, st)
        except OSError:
            key = None
        with self.lock:
            if key is None or key in self.bound or not self._room_for_one():
                os.close(fd)
                return
            slot = self.table.put(BoundTable.BOUND, key) if key[0] == "handle" else None
            self.bound[key] = (fd, st.st_dev, st.st_ino, slot)

    def _room_for_one(self) -> bool:
        """(self.lock) A record may be added: under MAX_BOUND, after those
        of sockets no longer listened on (sock_diag) are dropped. Past it,
        a new socket is not recorded, and connects to it are refused."""
        if len(self.bound) < MAX_BOUND and self.table.free:
            return True
        try:
            with self.diag_lock:
                alive = unix_diag.listening_files(self.diag)
        except (OSError, unix_diag.DiagError):
            return False
        for key, (fd, dev, ino, slot) in list(self.bound.items()):
            if (dev, ino & 0xFFFFFFFF) not in alive:
                del self.bound[key]
                if slot is not None:
                    self.table.clear(slot)
                os.close(fd)
        return len(self.bound) < MAX_BOUND and bool(self.table.free)

    def _at_loopback(self, tid: int, port: int, result: int) -> None:
        if result == 0:
            with self.lock:
                self._listened(port)       # connects to it may go on now
        elif result in (errno.ECONNREFUSED, errno.EINPROGRESS):
            self._refused_at_loopback(tid, port, result)

    def _refused_at_loopback(self, tid: int, port: int, result: int) -> None:
        """A connect to the sandbox's loopback refused for certain
        (ECONNREFUSED), or under way on a port nothing in the sandbox listens
        on (a non-blocking connect hears the reset later): reported once per
        port, as evidence for a hint, never as a decision, before the program
        hears it. A port once seen with a listener (the doors, the program's
        own servers) is not reported, whatever the result: every non-blocking
        connect to a door would otherwise cost a sock_diag dump, and the
        compiled path, which makes or lets go on such connects, reports
        none (connect_judge.reports_refusal)."""
        with self.lock:
            if port in self.refused_ports or len(self.refused_ports) >= MAX_REFUSED_PORTS:
                return
            if not cj.reports_refusal(port, self.listened_bits):
                return
        if result == errno.EINPROGRESS:
            from stages.kernel.inet_diag import loopback_listener
            try:
                if loopback_listener(port):
                    with self.lock:
                        self._listened(port)
                    return
            except (OSError, unix_diag.DiagError):
                return          # no evidence: no report
        with self.lock:
            if port in self.refused_ports or len(self.refused_ports) >= MAX_REFUSED_PORTS:
                return
            self.refused_ports.add(port)
        self.report(RefusedLoopbackConnect(port, *self._who(tid)))

    def _listened(self, port: int) -> None:
        """A listener was seen on the loopback's `port` (self.lock held)."""
        self.listened_bits[port >> 3] |= 1 << (port & 7)

    def _has_listener(self, port: int) -> bool:
        return bool(self.listened_bits[port >> 3] >> (port & 7) & 1)

    def _thread_group(self, tid: int) -> int:
        for line in self._proc_text(tid, "status").splitlines():
            if line.startswith("Tgid:"):
                return int(line.split()[1])
        raise OSError(errno.ESRCH, "no Tgid")

    def _proc_text(self, tid: int, name: str) -> str:
        fd = os.open(f"{tid}/{name}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.proc)
        try:
            return os.read(fd, 4096).decode("utf-8", "replace")
        finally:
            os.close(fd)

    def _open_in_root(self, tid: int, path: bytes) -> int:
        """An O_PATH fd of `path` as the program's thread would find it: from
        its root (RESOLVE_IN_ROOT on /proc/TID/root, which also refuses
        /proc's magic links with EXDEV), relative paths from its working
        directory."""
        if not path.startswith(b"/"):
            cwd = os.readlink(f"{tid}/cwd", dir_fd=self.proc)
            if not cwd.startswith("/"):
                raise OSError(errno.ENOENT, "the working directory is out of reach")
            path = cwd.encode().rstrip(b"/") + b"/" + path
        path = self._proc_self(tid, path)
        root = os.open(f"{tid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.proc)
        try:
            for _ in range(4):
                try:
                    return sn.openat2(root, path, os.O_PATH | os.O_CLOEXEC, sn.RESOLVE_IN_ROOT)
                except OSError as e:
                    if e.errno == errno.ENOENT and leads_through_proc_self(
                            path, lambda prefix: _link_in_root(root, prefix)):
                        # A symlink into /proc/self: for us (outside the PID
                        # namespace) "self" is nothing, for the program its
                        # own magic links. Refused and recorded as those are.
                        raise OSError(errno.EXDEV, "a symlink into /proc/self") from None
                    if e.errno != errno.EAGAIN:     # a rename raced the lookup: again
                        raise
            raise OSError(errno.EAGAIN, "the path kept changing")
        finally:
            os.close(root)

    def _proc_self(self, tid: int, path: bytes) -> bytes:
        """/proc/self and /proc/thread-self name the asking thread inside the
        sandbox's /proc, but nothing for us (we are outside its PID
        namespace): spelled with the thread's own PID, the lookup meets the
        magic link behind them and is refused as such (EXDEV), and recorded."""
        parts = [p for p in path.split(b"/") if p not in (b"", b".")]
        while parts[:1] == [b".."]:
            del parts[0]            # ".." at the root is the root (RESOLVE_IN_ROOT too)
        if len(parts) < 2 or parts[0] != b"proc" or parts[1] not in (b"self", b"thread-self"):
            return path
        pid = self._who(tid)[0]
        if not pid:
            return path
        return b"/".join([b"", b"proc", str(pid).encode(), *parts[2:]])

    def _refuse(self, n: sn.Notification, raw: bytes, why: str) -> None:
        where = shown(unix_destination(raw)) if raw[:2] == cj.UNIX_FAMILY else shown_inet(raw)
        self.report(Report(False, where, *self._who(n.pid), why))

    def _who(self, tid: int) -> tuple[int, str]:
        """The thread's PID as the program sees it (the last NSpid) and its name."""
        try:
            pid = 0
            for line in self._proc_text(tid, "status").splitlines():
                if line.startswith("NSpid:"):
                    pid = int(line.split()[-1])
            return pid, self._proc_text(tid, "comm").strip()
        except (OSError, ValueError):
            return 0, ""


PROC_SELF_NAMES = (b"self", b"thread-self")
MAXSYMLINKS = 40                # the kernel's limit on links followed in one lookup


def leads_through_proc_self(path: bytes, readlink: Callable[[bytes], bytes | None]) -> bool:
    """Pure: does the absolute `path`, its symlinks followed as the kernel
    follows them (RESOLVE_IN_ROOT: ".." stops at the root), pass through
    /proc/self or /proc/thread-self? `readlink(prefix)` gives the target of
    the symlink at `prefix` (an absolute path with no symlink left in it), or
    None when it is no symlink (or nothing)."""
    done: list[bytes] = []
    todo = [part for part in path.split(b"/") if part]
    links = 0
    while todo:
        part = todo.pop(0)
        if part == b".":
            continue
        if part == b"..":
            if done:
                done.pop()
            continue
        if done == [b"proc"] and part in PROC_SELF_NAMES:
            return True
        target = readlink(b"/" + b"/".join([*done, part]))
        if target is None:
            done.append(part)
            continue
        links += 1
        if links > MAXSYMLINKS:
            return False
        if target.startswith(b"/"):
            done = []
        todo[:0] = [part for part in target.split(b"/") if part]
    return False


def _link_in_root(root: int, path: bytes) -> bytes | None:
    """The target of the symlink at `path` under `root`, or None."""
    try:
        fd = sn.openat2(root, path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, sn.RESOLVE_IN_ROOT)
    except OSError:
        return None
    try:
        return os.readlink(b"", dir_fd=fd)
    except OSError:
        return None         # EINVAL: no symlink
    finally:
        os.close(fd)



# ---------------------------------------------------------------- the helper's side

def missing() -> str | None:
    """None when this kernel and libseccomp have what the supervisor needs;
    else what is missing (the run then refuses every Unix socket, as before,
    and `vpnw doctor` says why)."""
    try:
        from stages.helper.seccomp_rules import libseccomp_version
        if libseccomp_version()[1] < 5:     # the API level, as pyseccomp's get_api() says it
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


def named_sockets(entries) -> list[NamedSocket]:
    """The policy's [unix] allow entries ((as written, path)) that are sockets
    now, each with an O_PATH fd of its socket file (the supervisor names it
    by its handle: connect_judge.identity_key), whatever path reaches it.
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
    from stages.helper.seccomp_rules import load_with_listener
    listener = load_with_listener(seccomp_filter)
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
        # (sandbox.collect_from_now).
        gc.freeze()
        gc.enable()
        priv.prctl(priv.PR_SET_PDEATHSIG, 9)
        link_.program_end.close()
        from stages.kernel.descriptors import close_all_but
        close_all_but({link_.supervisor_end.fileno(), link_.proc_fd, status_fd,
                       *(entry.fd for entry in named)})
        _serve_when_listened(link_, named, report, listened)
        code = 0
    finally:
        os._exit(code)


def _serve_when_listened(link_: SupervisorLink, named, report, listened: tuple = ()) -> None:
    compiled_path()     # loaded while the program's process still starts, not after
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
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        Supervisor(fds[0], link_.proc_fd, named, report, listened).serve()
    finally:
        # Closed, the listener makes every connect still to come fail
        # (ENOSYS): never one that nobody checked.
        os.close(fds[0])

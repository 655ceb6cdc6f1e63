"""The supervisor's process shell: the threads that receive the program's
notified connect() and listen() calls, read what the judge asks
(live_call.py), do what it says, and answer (the package's docstring says
why it connects itself rather than let the kernel go on)."""
from __future__ import annotations

import errno
import os
import select
import socket
import threading

from stages.helper.supervisor import judge
from stages.helper.supervisor.bound import BoundSockets
from stages.helper.supervisor.compiled import compiled_path
from stages.helper.supervisor.judge import AF_UNIX, loopback_port, unix_destination
from stages.helper.supervisor.live_call import LiveCall
from stages.helper.supervisor.program_threads import Threads, who
from stages.helper.supervisor.reports import RefusedLoopbackConnect, Report, shown, shown_inet
from stages.kernel import seccomp_notify as sn
from stages.kernel import unix_diag

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Callable

# One thread at a time receives; it hands that turn to another before a
# connect of its own that may wait (a full backlog), and one more starts when
# no other is parked, up to this many, so such a connect holds only its own
# thread. Past this many, the program only waits on itself.
MOST_RECEIVERS = 32
# What _decide answers when the kernel may go on with the program's own call.
GO_ON = -1
# The loopback ports whose refusals are reported (evidence for a hint; the
# rest of a scan adds nothing).
MAX_REFUSED_PORTS = 16


class Supervisor:
    """The threads over one seccomp listener. `report` is called (and must
    have written the record) before the program is answered; `named`: the
    policy's sockets (launch.NamedSocket each)."""

    def __init__(self, listener: int, proc_fd: int, named: list,
                 report: Callable[[Report | RefusedLoopbackConnect], None], listened: tuple = ()):
        self.listener = listener
        self.proc = proc_fd
        self._report = report
        # The sandbox's network namespace, by its cookie (SO_NETNS_COOKIE of
        # a socket made here: the supervisor is in it for life).
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as own:
            self.cookie = sn.CookieReader()(own.fileno())
        self.lock = threading.Lock()        # the counts below, the bound sockets
        self.receivers = 0                  # receiving threads started
        self.parked = 0                     # of them, waiting for the turn
        self.turn = threading.Lock()        # held by the one thread that receives
        self.over = False                   # serve() has returned
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
        self.sockets = BoundSockets(named, self.lock)
        self.view = judge.Sandbox(self.listened_bits, self.sockets.bound, self.sockets.named)

    # ------------------------------------------------------------ threads

    def serve(self) -> None:
        """Answer notifications until no process uses the filter any more. The
        receiving threads answer; this one only waits for the listener's
        hang-up (registered for no event, poll wakes for POLLHUP/POLLERR only)."""
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
        threads = Threads(self.proc)
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
        self.fast.receive(self.listener, self.proc, self.listened_bits, self.sockets.table.data,
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
        connected), once the connect is made. What to do is the judge's
        (pure); this reads what it asks for and does what it says."""
        call = LiveCall(n, threads, held, self.cookie)
        answer = judge.decide(call, self.view)
        action = answer.action
        if action == judge.ERRNO:
            return answer.errno
        if action == judge.LISTEN:
            self.sockets.record_listener(call)
            return GO_ON
        if action == judge.GO_ON:
            return GO_ON
        if action != judge.REFUSE and os.get_blocking(call.sock):
            # Only a blocking socket's connect can wait (on a full backlog);
            # a non-blocking one (Node, Go, libuv, asyncio) answers at once.
            self._hand_over(threads)
        # The thread still waits: the TID named it all along, so the socket,
        # the bytes and the file its path names came from it.
        if not sn.still_pending(self.listener, n.id):
            return None
        if action == judge.REFUSE:
            self._refuse(n, call.raw, answer.why)
            return errno.EPERM
        if action == judge.CONNECT_TARGET:
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
        none (judge.reports_refusal)."""
        with self.lock:
            if port in self.refused_ports or len(self.refused_ports) >= MAX_REFUSED_PORTS:
                return
            if not judge.reports_refusal(port, self.listened_bits):
                return
        if result == errno.EINPROGRESS:
            # Only a connect under way to a port never listened on asks
            # (inet_diag and its import: some ms, kept off every other connect).
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

    def _refuse(self, n: sn.Notification, raw: bytes, why: str) -> None:
        where = shown(unix_destination(raw)) if raw[:2] == judge.UNIX_FAMILY else shown_inet(raw)
        self.report(Report(False, where, *self._who(n.pid), why))

    def _who(self, tid: int) -> tuple[int, str]:
        return who(self.proc, tid)

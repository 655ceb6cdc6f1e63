"""The broker's run: check the path, accept handed-over connections, give
each to its door's session, wind down, report the totals.

One asyncio loop (epoll) serves every connection: it accepts on the doors'
listening sockets (handed over by the helper once, handoff.py), then runs a
task per connection for the handshake and the dial, then the splice relay
(readiness callbacks, no task work per byte). Name lookups run in the loop's
bounded thread pool.

The jobs live apart: this module is the run's lifecycle; journal.py writes
the record and counts; connector.py decides and dials (Opened | Denied |
Failed); sessions.py holds one session type per door, driving the sans-I/O
parsers.
"""
from __future__ import annotations

import asyncio
import errno
import resource
import signal
import socket
import threading
import time

from stages.wire import status as st
from stages.wire.exits import ExitCode
from stages.wire.handoff import take_pending
from stages.record import event_types as ev
from stages.record.events import Emitter
from stages.config.policy import Policy
from stages.broker.connector import Connector
from stages.broker.local_addresses import local_addresses
from stages.broker.warn import warn
from stages.broker.dial import PathDownError
from stages.broker.dialers import dialer_for
from stages.broker.journal import Journal, ms_since
from stages.broker.handshake_cap import MAX_PENDING_HANDSHAKES
from stages.broker.relay import Relay
from stages.broker.local_door import LocalDoor
from stages.broker.sessions import DoorContext, HttpDoor, Socks5Door
from stages.broker.workers import LOAD_PER_TICK, LOAD_TICK, Crew


_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Broker:
    """The run's lifecycle: path check first, then every handed-over
    connection to its door, until the helper is gone or SIGTERM; then a
    bounded grace for open relays, and the totals."""

    def __init__(self, *, emitter: Emitter, status_fd: int, policy, path,
                 dry_run: bool = False, grace: float = 2.0,
                 local_addresses: frozenset = frozenset(), path_reported: bool = False,
                 numbers=None, crew: Crew | None = None, crew_at_once: bool = False,
                 ask_fd: int | None = None, ask_worker: bool = False, record_gate=None,
                 fake_names=None, secrets=None):
        self.path_reported = path_reported  # main_from_fds already said the direct path is ok
        self.path = path
        self.grace = grace
        self.crew = crew                    # the workers, when this is their lead (workers.py)
        self.crew_at_once = crew_at_once    # forked when the loop starts, not at the first load
        self.journal = Journal(emitter, status_fd, numbers)
        self.dialer = dialer_for(path)
        # The path's own addresses (a WireGuard tunnel's) are this run's, like the machine's.
        local_addresses = local_addresses | self.dialer.own_addresses
        self.connector = Connector(self.journal, policy=policy, dialer=self.dialer,
                                   via=path.name, dry_run=dry_run,
                                   local_addresses=local_addresses, hold=_hold(ask_fd, ask_worker),
                                   record_gate=record_gate,
                                   fake_names=fake_names)
        self.fake_names = fake_names
        self.datagram_doors: list = []                  # the DNS door's UDP sockets (the lead's)
        # The running loop, kept: asyncio.get_running_loop() asks the kernel
        # for the pid on every call (fork detection), several times a connection.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task] = set()
        self.context = DoorContext(self.journal, self.connector, fake_names=fake_names)
        self.relays: set[Relay] = self.context.relays
        self.stopping: asyncio.Event | None = None
        self.handshaking: set[socket.socket] = self.context.handshaking
        self.listening: list[tuple[str, socket.socket]] = []   # the doors, handed over by the helper
        self.taken_this_tick = 0                        # for the crew's load check
        self.load_look = None                           # its timer, while connections come
        self.paused_said = False
        self.doors = {"socks": Socks5Door(self.context), "http": HttpDoor(self.context),
                      "local": LocalDoor(self.context), **_capture_doors(self.context),
                      **_secret_doors(self.context, secrets)}

    async def check_path(self) -> bool:
        if self.path_reported:
            return True
        started = time.monotonic()
        name = self.path.name
        kind = self.dialer.kind
        try:
            await self.dialer.check()
        except PathDownError as exc:
            ms = ms_since(started)
            self.journal.emit(ev.PathCheck(path=name, type=kind, ok=False, ms=ms, error=str(exc)))
            self.journal.status(st.PathDown(path=name, error=str(exc)))
            return False
        ms = ms_since(started)
        self.journal.emit(ev.PathCheck(path=name, type=kind, ok=True, ms=ms))
        self.journal.status(st.PathOk(path=name, type=kind, ms=ms))
        return True

    async def run(self, handoff: socket.socket, early=None) -> int:
        loop = self.loop = self.journal.loop = self.context.loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        if threading.current_thread() is threading.main_thread():
            loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        # A SIGTERM during the path check (vpnw interrupted before the program
        # starts) must not wait out the check's timeout.
        checking = asyncio.ensure_future(self.check_path())
        stopped = asyncio.ensure_future(self.stopping.wait())
        await asyncio.wait({checking, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not checking.done():
            checking.cancel()
            await asyncio.wait({checking})
            self.report_totals()
            return ExitCode.PATH_DOWN
        if not checking.result():
            self.report_totals()
            return ExitCode.PATH_DOWN
        handoff.setblocking(False)
        if early is not None:
            # What the link said while the loop loaded (startup.py).
            for message in early.warnings:
                warn(message)
            for handed in early.handed:
                self._on_handed(handed)
        if early is not None and early.link_over:
            self.stopping.set()
        else:
            loop.add_reader(handoff.fileno(), self._on_handoff, handoff)
        if self.crew is not None and self.crew_at_once:
            self.crew.start(self._doors_for_workers())
        try:
            await self.stopping.wait()
        finally:
            loop.remove_reader(handoff.fileno())
            for datagrams in self.datagram_doors:
                # Queries sent as the program ended are answered and recorded too.
                loop.remove_reader(datagrams.sock.fileno())
                datagrams.serve_batch(None)
                datagrams.sock.close()
            for door, listener in self.listening:
                loop.remove_reader(listener.fileno())
                # A connection the program made just before it ended waits
                # complete in the backlog: it is taken and served (within the
                # grace) so that it reaches the record, never dropped unseen.
                self._drain(door, listener)
                listener.close()
            if self.crew is not None:
                self.crew.release()     # the workers wind down alongside
        await self._wind_down()
        self.report_totals()
        return 0

    def report_totals(self) -> None:
        """The run's totals: this process's, and its workers' once they end."""
        if self.crew is not None:
            self.crew.release()
            sums, missing = self.crew.collect(timeout=self.grace + 5.0)
            self.journal.add_totals(sums)
            if missing:
                warn(f"{missing} broker worker(s) ended without reporting their totals; "
                      "their connections are in the record but not in these counts")
        self.journal.report_totals()

    def _on_handoff(self, handoff: socket.socket) -> None:
        pending = take_pending(handoff, 64)
        for problem in pending.problems:
            warn(problem)
        for handed in pending.handed:
            self._on_handed(handed)
        if pending.ended:
            self.stopping.set()

    def _on_handed(self, handed) -> None:
        handed.sock.setblocking(False)
        if handed.door == "dns" and self.fake_names is None:
            warn("dropped a DNS door the run did not ask for (no capture)")
            handed.sock.close()
        elif handed.door == "secret" and "secret" not in self.doors:
            warn("dropped a secret door the run did not ask for (no secrets)")
            handed.sock.close()
        elif handed.kind == "datagram":
            from stages.broker.dns_door import DnsDatagrams   # loaded with the loop (main._load_the_loop)
            door = DnsDatagrams(self.context, handed.sock)
            self.datagram_doors.append(door)
            self.loop.add_reader(handed.sock.fileno(), door.on_readable)
        elif handed.kind == "door":
            # The DNS door and the secret doors stay the lead's (_doors_for_workers).
            if self.crew is not None and handed.door not in ("dns", "secret"):
                self.crew.pass_door(handed.door, handed.sock)   # to workers already forked
            self.listening.append((handed.door, handed.sock))
            self.loop.add_reader(handed.sock.fileno(), self._on_door, handed.door, handed.sock)
        else:
            self._take(handed.door, handed.sock)

    def _on_door(self, door: str, listener: socket.socket) -> None:
        """Accept what the door holds (a bounded batch: the loop stays fair
        to the connections already open)."""
        problem = self._accept(door, listener, 64)
        if problem is not None:
            self._pause_door(door, listener, problem)

    def _drain(self, door: str, listener: socket.socket) -> None:
        """Take every connection the door's backlog holds (the end of the run)."""
        self._accept(door, listener, None)

    def _accept(self, door: str, listener: socket.socket, most: int | None) -> OSError | None:
        """Take up to `most` (None: all) waiting connections; the error that
        stopped it when the process is out of descriptors or memory."""
        taken = 0
        while most is None or taken < most:
            taken += 1
            try:
                sock, _peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return None
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    return exc
                continue    # that one connection is gone (ECONNABORTED)
            sock.setblocking(False)
            self._take(door, sock)
        return None

    def _pause_door(self, door: str, listener: socket.socket, exc: OSError) -> None:
        """Out of descriptors or memory: the connections wait in the door's
        backlog and the door is looked at again shortly (a readable door
        left registered would spin the loop)."""
        loop = self.loop
        loop.remove_reader(listener.fileno())
        if not self.paused_said:
            self.paused_said = True
            warn(f"cannot accept on the {door} door ({exc.strerror or exc}); "
                  "new connections wait until connections close")

        def resume() -> None:
            if listener.fileno() != -1 and not self.stopping.is_set():
                loop.add_reader(listener.fileno(), self._on_door, door, listener)
        loop.call_later(0.1, resume)

    def _watch_load(self) -> None:
        """A connection was taken: look at the load LOAD_TICK from now, unless
        a look is already due. The tick runs only while connections come: an
        idle broker (most of an agent's run) is never woken by it (a timer
        that ran for the whole run woke the broker 20 times a second)."""
        if self.load_look is None and self.crew is not None and not self.crew.started:
            self.load_look = self.loop.call_later(LOAD_TICK, self._check_load)

    def _check_load(self) -> None:
        """The look: a busy tick forks the workers (workers.py); a quiet
        one starts the count again, with the next connection."""
        self.load_look = None
        if self.stopping.is_set():
            return
        if self.taken_this_tick >= LOAD_PER_TICK:
            self.connector.lookups.pause(self._fork_crew)
            return
        self.taken_this_tick = 0

    def _fork_crew(self) -> None:
        """Load: the workers, forked once no name lookup is in flight
        (connector.LookupThreads; new lookups wait until then)."""
        if not self.stopping.is_set():
            self.crew.start(self._doors_for_workers())
        self.connector.lookups.resume()

    def _doors_for_workers(self) -> list[tuple[str, socket.socket]]:
        # The DNS door stays the lead's: only it gives made-up addresses; the
        # secret doors too: the secrets' values, fetched again, live there.
        return [(door, sock) for door, sock in self.listening if door not in ("dns", "secret")]

    def _take(self, door: str, sock: socket.socket) -> None:
        self.taken_this_tick += 1
        self._watch_load()
        if len(self.handshaking) >= MAX_PENDING_HANDSHAKES:
            sock.close()
            self.journal.handshake_failed("refused", f"{MAX_PENDING_HANDSHAKES} connections are already "
                                                     "waiting to send their request; this one was "
                                                     "closed at once")
            return
        self.handshaking.add(sock)
        task = self.loop.create_task(self._serve(door, sock))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _wind_down(self) -> None:
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=self.grace)
        for relay in list(self.relays):
            relay.abort()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(set(self.tasks))

    async def _serve(self, door: str, sock: socket.socket) -> None:
        try:
            await self.doors.get(door, self.doors["http"]).serve(sock)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # one connection's bug must not end the run
            warn(f"internal error on a {door} connection: {exc!r}")
        finally:
            self.handshaking.discard(sock)
            sock.close()


def _secret_doors(context: DoorContext, secrets) -> dict:
    """The secret doors (secret_door.py), on a run whose policy has secrets."""
    if secrets is None:
        return {}
    # only a run with secrets loads the secret doors (and ssl)
    from stages.broker.secret_door import SecretDoor, SecretKeeper
    keeper = SecretKeeper(secrets.secrets, secrets.values, secrets.ports, secrets.env)
    return {"secret": SecretDoor(context, keeper)}


def _capture_doors(context: DoorContext) -> dict:
    """The capture door and the DNS door's TCP side, on a run with capture
    (the DNS door's names exist): their modules load only for such a run
    (main.py loads them with the loop), not on every run's first connection."""
    if context.fake_names is None:
        return {}
    # only a run with capture loads them (the docstring says why)
    from stages.broker.capture_door import CaptureDoor
    from stages.broker.dns_door import DnsTcpDoor        # (the same)
    return {"capture": CaptureDoor(context), "dns": DnsTcpDoor(context)}


def _hold(ask_fd: int | None, worker: bool):
    """guard --ask: the link to the orchestrator, which asks the person
    (hold.py); a worker's own, made from the lead's."""
    if ask_fd is None:
        return None
    # only guard --ask holds connections
    from stages.broker.hold import Hold
    return Hold.for_worker(ask_fd) if worker else Hold(ask_fd)


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def run_broker(handoff_fd: int, event_fd: int, status_fd: int, *, run_id: str, policy, path,
               dry_run: bool = False, grace: float = 2.0, path_reported: bool = False,
               numbers=None, crew: Crew | None = None, crew_at_once: bool = False, early=None,
               ask_fd: int | None = None, ask_worker: bool = False, record_gate=None,
               fake_names=None, secrets=None) -> int:
    """The broker process body (the lead's, or a worker's: then `crew` is
    None and `numbers` the shared counter); returns its exit code (0,
    PATH_DOWN, INTERNAL)."""
    broker = None
    try:
        _raise_fd_limit()
        if policy is None:
            policy = Policy.allow_all()
        broker = Broker(emitter=Emitter(event_fd, run_id, path=path.name),
                        status_fd=status_fd, policy=policy, path=path, path_reported=path_reported,
                        dry_run=dry_run, grace=grace, local_addresses=local_addresses(),
                        numbers=numbers, crew=crew, crew_at_once=crew_at_once,
                        ask_fd=ask_fd, ask_worker=ask_worker,
                        record_gate=record_gate,
                        fake_names=fake_names, secrets=secrets)
        return _serve_until_the_end(broker, handoff_fd, early)
    except Exception as exc:
        warn(f"the broker failed: {exc!r}")
        if broker is not None:
            broker.report_totals()
        return ExitCode.INTERNAL


def _serve_until_the_end(broker: Broker, link_fd: int, early=None) -> int:
    link = socket.socket(fileno=link_fd)
    try:
        return asyncio.run(broker.run(link, early))
    finally:
        broker.journal.flush_events()
        link.detach()

"""From a door's request to a connection: decide (looking the name up only
when an address could change the answer), then dial through the path.

`Connector.connect` returns one of three outcomes, having written every event
on the way; a request always ends in exactly one of policy.deny (enforced),
conn.fail or conn.open, even when the run stops in the middle of it.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
import time

from stages.startup.records import NamedTuple   # not dataclasses: the loop's import (records.py)
from stages.record import event_types as ev
from stages.broker import decide
from stages.broker.dial import DialError
from stages.broker.hosts_file import HostsFile
from stages.broker.journal import Journal, ms_since

DNS_TIMEOUT = 15.0
MACHINE_STEP = True     # see Connector.machine_step
RECORD_FULL = ("the record has no room left (its file system is full): vpnw dials nothing "
               "it cannot record")


class Opened:
    """A connection dialled, counted while it relays. A plain class, not a
    dataclass: made once per connection, and ~1 ms less on the loop's import."""
    __slots__ = ("conn", "sock", "address", "port", "dial_ms", "opened_at", "bytes_up", "bytes_down",
                 "stream")

    def __init__(self, conn: int, sock: socket.socket, address: str, port: int, dial_ms: int,
                 opened_at: float, bytes_up: int = 0, bytes_down: int = 0):
        self.conn, self.sock, self.address, self.port = conn, sock, address, port
        self.dial_ms, self.opened_at = dial_ms, opened_at
        self.bytes_up, self.bytes_down = bytes_up, bytes_down
        self.stream = None      # what a dial's `finish` made of the socket (a secret door's TLS)


class Denied(NamedTuple):
    reason: str
    rule: str
    asked: dict | None = None     # guard --ask: {"by": ..., "answer": ...} for the record
    host: str = ""                # the destination as the DENY line names it (set by connect)
    port: int = 0

    def text(self) -> str:
        """The refusal as every door says it, the DENY line's words:
        `vpnw: evil.example:443 denied: REASON`."""
        target = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        return f"vpnw: {target} denied: {self.reason}"


class Failed(NamedTuple):
    stage: str      # resolve | dial | path (conn.fail's stages past the handshake)
    error: str      # conn.fail's error (dial.DIAL_ERRORS)
    reason: str


class _Allowed(NamedTuple):
    """Decided: go on and dial these addresses (empty: the exit resolves)."""
    host: str
    addresses: tuple


class LookupThreads:
    """getaddrinfo in threads (it blocks), counted until each thread's call
    has returned, even one whose request stopped waiting for it: a process
    may fork (workers.py) only while no thread is inside the C library's
    resolver, whose locks a thread that does not exist in the child could
    hold there for good. pause(then) makes new lookups wait and calls
    then() once none is in flight; resume() lets them go."""

    def __init__(self):
        self.executor = None
        self.in_flight = 0
        self.paused: asyncio.Event | None = None
        self.then = None

    async def getaddrinfo(self, host: str, port: int) -> list:
        while self.paused is not None:
            await self.paused.wait()
        loop = asyncio.get_running_loop()
        if self.executor is None:
            # the pool's concurrent.futures loads at the run's first lookup (lean_asyncio.py)
            from stages.startup.lean_asyncio import thread_pool_executor
            self.executor = thread_pool_executor()(thread_name_prefix="vpnw-lookup")
        self.in_flight += 1
        call = self.executor.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        call.add_done_callback(lambda _: loop.call_soon_threadsafe(self._returned))
        return await asyncio.wrap_future(call)

    def _returned(self) -> None:
        self.in_flight -= 1
        if not self.in_flight and self.then is not None:
            then, self.then = self.then, None
            then()

    def pause(self, then) -> None:
        if self.paused is None:
            self.paused = asyncio.Event()
        if self.in_flight:
            self.then = then
        else:
            then()

    def resume(self) -> None:
        if self.paused is not None:
            self.paused.set()
        self.paused = self.then = None


def _peer_closed(sock: socket.socket | None) -> bool:
    """Whether the program has closed its end of the connection (EOF or a
    reset waiting on the socket): it gave up waiting."""
    if sock is None:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def _stopped(stage: str, client, requested: float) -> Failed:
    """How a request still being resolved or dialed when the run ends is
    recorded: one the program had given up on is said so, never as vpnw's
    own stop (the record's reason, and the closing summary's)."""
    waited = time.monotonic() - requested
    if _peer_closed(client):
        return Failed(stage, "timeout", f"the program gave up waiting and closed the connection "
                                        f"before it was made (vpnw was still at the {stage} step "
                                        f"when the run ended, {waited:.1f} s after the request)")
    return Failed(stage, "internal", "vpnw stopped before the connection was made "
                                     f"(the run ended {waited:.1f} s after the request)")


class Connector:
    def __init__(self, journal: Journal, *, policy, dialer, via: str, dry_run: bool,
                 local_addresses: frozenset, hold=None, record_gate=None, fake_names=None,
                 machine_step: bool | None = None):
        self.decide = decide
        self.journal = journal
        self.policy = policy
        self.dialer = dialer
        self.via = via
        self.dry_run = dry_run
        self.local_addresses = local_addresses
        self.resolves_at_exit = dialer.resolves_at_exit
        self.hosts = HostsFile()
        self.hold = hold              # guard --ask: hold.Hold, asks instead of the default's denial
        self.record_gate = record_gate
        self.fake_names = fake_names  # with capture: the DNS door's made-up addresses (fake_ips.py)
        self.lookups = LookupThreads()
        # Step 4 (the machine itself) is always on for vpnw. Off only in the
        # broker's own tests, whose origins listen on this machine's loopback
        # (tests/conftest.py `origins_on_loopback`); no command line, file or
        # environment variable sets it.
        self.machine_step = MACHINE_STEP if machine_step is None else machine_step

    async def connect(self, conn: int, door: str, kind: str, host: str,
                      port: int, client: socket.socket | None = None, *, finish=None,
                      **request_fields) -> Opened | Denied | Failed:
        """`finish(sock, host)`: awaited on the dialled socket before the
        connection counts as open (a secret door's TLS handshake: its failure
        is the request's conn.fail, error "tls"); what it returns is
        Opened.stream. `request_fields` go into conn.request (a secret door's name)."""
        fake, host = self._made_up(host)
        where = {"host": host, "port": port, "door": door}     # policy.* events carry it too
        self.journal.emit(ev.ConnRequest(conn, door=door, kind=kind, host=host, port=port,
                                         fake_address=None if fake is None else str(fake),
                                         **request_fields))
        if fake is not None and host == str(fake):
            # only with capture's DNS door, and then only for an address it gave no name
            from stages.broker.fake_ips import not_given_reason
            return self._end(conn, Denied(not_given_reason(fake), "dns-door"), where)
        stage = "resolve"
        requested = time.monotonic()
        try:
            decided = await self._decide(conn, host, port, door)
            if isinstance(decided, _Allowed):
                stage = "dial"
                outcome = await self._record_full() or await self._dial(conn, decided, port, finish)
            else:
                outcome = decided
        except asyncio.CancelledError:
            self._end(conn, _stopped(stage, client, requested))
            raise
        except Exception as exc:  # noqa: BLE001 - the request still ends in the record
            outcome = Failed(stage, "internal", f"vpnw failed: {exc!r}")
        return self._end(conn, outcome, where)

    def name_refusal(self, host: str) -> str | None:
        """The DNS door's question (decide.name_refusal): why `host` is
        refused at every port by name alone, or None. Under --dry-run
        nothing is refused by name: the connections go on."""
        if self.dry_run:
            return None
        return self.decide.name_refusal(host, self.policy, asks=self.hold is not None)

    def _made_up(self, host: str):
        """(the DNS door's made-up address, the name it stands for) when
        `host` is one (docs/architecture.md "The DNS door"): every door then
        decides the name, exactly as if it had been asked for it. An address
        of the pool this run gave no name keeps its text (and is refused)."""
        names = self.fake_names
        if names is None or not host[:1].isdigit() and not host.startswith(("[", "::")):
            return None, host
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return None, host
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if not names.in_pool(address):
            return None, host
        return address, names.name_for(address) or str(address)

    def _end(self, conn: int, outcome, where: dict | None = None):
        """The one terminal event of a request, and its count. A denial names
        its destination itself (docs/record.md): a query for denials needs
        no join with conn.request."""
        journal = self.journal
        if isinstance(outcome, Opened):
            journal.emit(ev.ConnOpen(conn, address=outcome.address, port=outcome.port,
                                     via=self.via, ms=outcome.dial_ms))
        elif isinstance(outcome, Denied):
            journal.deny(ev.PolicyDeny(conn, rule=outcome.rule, reason=outcome.reason, enforced=True,
                                       **where, **(outcome.asked or {})))
            outcome = outcome._replace(host=where["host"], port=where["port"])
        else:
            journal.fail(ev.ConnFail(conn, stage=outcome.stage, error=outcome.error,
                                     reason=outcome.reason))
        return outcome

    async def _decide(self, conn: int, host: str, port: int,
                      door: str = "") -> _Allowed | Denied | Failed:
        d = self.decide
        try:
            target = d.parse_target(host, port)
        except d.BadTarget as exc:
            return Denied(str(exc), "target")
        try:
            verdict = d.decide(target, self.policy, None, local_addresses=self.local_addresses,
                               resolves_at_exit=self.resolves_at_exit, machine_step=self.machine_step)
            if isinstance(verdict, d.LookUp):
                addresses = await self.resolve(conn, target.host, port)
                verdict = d.decide(target, self.policy, addresses, local_addresses=self.local_addresses,
                                   resolves_at_exit=self.resolves_at_exit, machine_step=self.machine_step)
                if isinstance(verdict, d.LookUp):
                    raise RuntimeError("decide asked for a second lookup")
            asked = None
            if self.hold is not None and not verdict.allowed and verdict.rule == "default" \
                    and not self.dry_run:
                verdict, asked = await self._ask(conn, target, door)
                if isinstance(verdict, Denied):
                    return verdict
        except DialError as exc:
            return Failed("resolve", exc.error, exc.reason)
        if not verdict.allowed and (not self.dry_run or verdict.rule == d.MACHINE):
            # The machine itself is refused under --dry-run too: it is not the
            # policy's to trial (docs/architecture.md "The machine itself").
            return Denied(verdict.reason, verdict.rule)
        addresses = tuple(verdict.addresses or ())
        if not addresses and target.ip is not None:
            addresses = (target.ip,)
        if not addresses and not self.resolves_at_exit:
            # The policy did not need the addresses, but dialling does; and
            # step 4 judges every address dialled (decide.machine_check),
            # before the decision is written.
            try:
                addresses = await self.resolve(conn, target.host, port)
            except DialError as exc:
                return Failed("resolve", exc.error, exc.reason)
            machine = d.machine_check(target, self.policy, addresses, self.local_addresses) \
                if self.machine_step else None
            if machine is not None:
                return Denied(machine.reason, machine.rule, asked)
        if verdict.allowed:
            self.journal.emit(ev.PolicyAllow(conn, rule=verdict.rule, reason=verdict.reason,
                                             host=host, port=port, door=door, **(asked or {})))
        else:
            self.journal.deny(ev.PolicyDeny(conn, rule=verdict.rule, reason=verdict.reason,
                                            enforced=False, host=host, port=port, door=door))
        return _Allowed(target.host, addresses)

    async def _ask(self, conn: int, target, door: str):
        """No rule allows the target and the default denies it: the person
        decides (hold.py). Nothing has been looked up yet. An allowed
        target still meets the address checks (deny rules on addresses,
        deny_private), which come before the default: decided again with
        its addresses, anything but the default's denial stands."""
        d = self.decide
        answer = await self.hold.ask(target.host, target.port, door)
        asked = {"by": answer.by, "answer": answer.answer,
                 **({"scope": answer.scope} if answer.scope else {})}
        note = f"; {answer.note}" if answer.note else ""
        if not answer.allow:
            why = {"person": f"the person denied it ({answer.answer})",
                   "timeout": "nobody answered in time",
                   "no-terminal": "vpnw has no terminal to ask on"}.get(answer.by, "nobody could answer")
            return Denied(f"no allow rule matches {target}; asked: {why}{note}", "asked", asked), asked
        addresses = ()
        if target.ip is None and not self.resolves_at_exit and d.addresses_matter(target, self.policy):
            addresses = await self.resolve(conn, target.host, target.port)
            again = d.decide(target, self.policy, addresses, local_addresses=self.local_addresses,
                             machine_step=self.machine_step)
            if again.rule != "default":
                return Denied(again.reason, again.rule, asked), asked
            addresses = again.addresses
        return d.Decision(True, f"no allow rule matches {target}; asked: the person allowed it "
                                f"({answer.answer}){note}", "asked", addresses), asked

    async def _record_full(self) -> Failed | None:
        """Write-ahead (docs/security.md, "A full disk hides nothing"): the
        decision goes into the event pipe first (with the other decisions of
        this loop turn), then the gate is read; a closed gate (the record has
        no room left) refuses the dial."""
        if self.record_gate is None:
            return None
        await self.journal.written()
        if self.record_gate.is_open:
            return None
        return Failed("dial", "internal", RECORD_FULL)

    async def _dial(self, conn: int, allowed: _Allowed, port: int, finish=None) -> Opened | Failed:
        started = time.monotonic()
        try:
            sock, address = await self.dialer.dial(allowed.host, port, allowed.addresses)
        except DialError as exc:
            return Failed("path" if exc.error == "path-down" else "dial", exc.error, exc.reason)
        if sock.gettimeout() != 0.0:    # the dialers' sockets already are
            sock.setblocking(False)
        stream = None
        if finish is not None:
            try:
                stream = await finish(sock, allowed.host)
            except DialError as exc:
                sock.close()
                return Failed("dial", exc.error, exc.reason)
        opened = Opened(conn, sock, address, port, ms_since(started), time.monotonic())
        opened.stream = stream
        return opened

    async def resolve(self, conn: int, host: str, port: int) -> tuple:
        if self.dialer.resolve is not None:
            return await self._resolve_on_path(conn, host)
        started = time.monotonic()
        in_file = self.hosts.lookup(host)
        if in_file:
            # What getaddrinfo would answer from /etc/hosts, without its thread.
            self.journal.emit(ev.DnsResolve(conn, host=host, addresses=self.hosts.texts(host),
                                            ms=ms_since(started)))
            return in_file
        try:
            async with asyncio.timeout(DNS_TIMEOUT):
                infos = await self.lookups.getaddrinfo(host, port)
        except (OSError, asyncio.TimeoutError, UnicodeError) as exc:
            message = "timed out" if isinstance(exc, asyncio.TimeoutError) else (
                getattr(exc, "strerror", None) or str(exc))
            self.journal.emit(ev.DnsResolve(conn, host=host, addresses=[], ms=ms_since(started),
                                            error=message))
            raise DialError("dns", f"{host}: the name was not resolved ({message})") from None
        found = []
        for family, _, _, _, sockaddr in infos:
            if family not in (socket.AF_INET, socket.AF_INET6):
                continue
            ip = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
            if ip not in found:
                found.append(ip)
        self.journal.emit(ev.DnsResolve(conn, host=host, addresses=[str(a) for a in found],
                                        ms=ms_since(started)))
        if not found:
            raise DialError("dns", f"{host}: the name has no addresses")
        return tuple(found)

    async def _resolve_on_path(self, conn: int, host: str) -> tuple:
        """The path's own DNS (a WireGuard .conf's DNS =): the record says
        which server answered."""
        started = time.monotonic()
        try:
            found, server = await self.dialer.resolve(host)
        except DialError as exc:
            self.journal.emit(ev.DnsResolve(conn, host=host, addresses=[], ms=ms_since(started),
                                            error=exc.reason))
            raise
        self.journal.emit(ev.DnsResolve(conn, host=host, addresses=[str(a) for a in found],
                                        ms=ms_since(started), server=server))
        if not found:
            raise DialError("dns", f"{host}: {server} knows no addresses for the name")
        return tuple(found)

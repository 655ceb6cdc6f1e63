"""P, the seal: the helper's own process (init.py is C's life, program.py G's).

    P  helper: unshare, id maps, lo, seal check, doors, status; hands over
    │          every accepted connection; forwards SIGINT/SIGTERM to C
    └─ C  init, PID 1 of the new PID namespace: private mounts, fresh /proc,
          │ forwards signals, reaps orphans, exits with G's status
          └─ G  the program: fds closed, setsid, privileges dropped,
                seccomp, exec

P and C talk over one pipe (C -> P, stages/wire/status.py's INIT_REPORT): first
InitOk or InitFailed, at the end Exited, ExecFailed or SandboxFailed (G's
seal failed before exec, or init could not give G its terminal); with a
terminal, Stopped whenever the program stops (P passes it on, so the
orchestrator can suspend vpnw with it, as a shell job). G tells C why it
could not exec over a third pipe.
P starts C before it reports ready (so a failed /proc mount is a sandbox
error, not a surprise later); C forks G then, and G seals itself while P
reports ready, then waits for go and only execs. vpnw's go pipe is P's and
G's both: go is one byte for each (status.GO); its EOF, for either, is no go.

P's parts: the network (network.py: the loopback, the seal check, the
doors, the no-route counters), the terminal (terminal.py), the Unix-socket
supervisor it spawns (supervisor/launch.py); what the three processes share
is processes.py.
"""
from __future__ import annotations

import errno
import os
import select
import signal
import socket
import sys

from stages.config.client_env import apply as apply_client_env
from stages.helper import seccomp_cache, seccomp_rules
from stages.helper.init import init_life
from stages.helper.network import (check_network, no_route_count, open_counters, open_doors,
                                   open_dns_datagrams)
from stages.helper.processes import (DOCTOR_HINT, FORWARDED_SIGNALS, SealError, collect_from_now,
                                     decode_status, go_byte, kill_quietly, reap)
from stages.helper.supervisor import launch
from stages.helper.supervisor.reports import RefusedLoopbackConnect
from stages.helper.terminal import fresh_devpts, own_terminal
from stages.kernel import privileges as priv
from stages.startup.imports import import_pyseccomp
from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.startup.trace import mark
from stages.wire import handoff
from stages.wire import helper_plan
from stages.wire import status as st
from stages.wire.exits import ExitCode

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:   # annotations only: the helper imports no policy code at run time
    from typing import Callable

    from stages.config.file_limits import MountPlan
    from stages.config.protected import HelperProtection
    from stages.helper.supervisor.reports import Report
    from stages.wire.pty_handoff import ProgramTerminal


def program_env(env: dict[str, str]) -> dict[str, str]:
    """docs/architecture.md, "The sandbox", 5: the caller's env with the doors' settings and each client's
    own (stages/config/client_env.py). The orchestrator has usually applied it already;
    applying it again changes nothing."""
    return apply_client_env(env, python=sys.executable)[0]


def _unshare_and_map(namespaces: int = priv.SANDBOX_NAMESPACES) -> None:
    uid, gid = os.getuid(), os.getgid()
    try:
        priv.unshare(namespaces)
    except OSError as e:
        hint = {errno.EPERM: "unprivileged user namespaces look disabled or restricted "
                             "(kernel.unprivileged_userns_clone, AppArmor's "
                             "apparmor_restrict_unprivileged_userns, or a seccomp policy)",
                errno.ENOSPC: "the user.max_user_namespaces limit is reached or 0",
                errno.EINVAL: "the helper was not single-threaded or the kernel lacks "
                              "one of the namespace types",
                errno.EUSERS: "user namespaces are nested too deeply"}.get(e.errno, "")
        raise SealError(f"cannot create user/net/pid/ipc/mount namespaces: "
                        f"{os.strerror(e.errno)}{'; ' + hint if hint else ''}; {DOCTOR_HINT}")
    try:
        priv.write_id_maps(uid, gid)
    except OSError as e:
        raise SealError(f"cannot write the uid/gid maps of the new user namespace: "
                        f"{e.strerror}; {DOCTOR_HINT}")
    try:
        # Before any mount, so nothing we mount can propagate to the host.
        priv.mount(None, "/", None, priv.MS_REC | priv.MS_PRIVATE)
    except OSError as e:
        raise SealError(f"cannot make the sandbox's mounts private: {e.strerror}; {DOCTOR_HINT}")


def run(argv: list[str], handoff_fd: int, status_fd: int, go_fd: int,
        allow_unix_sockets: bool, env: dict[str, str] | None, files: MountPlan | None = None,
        tty: ProgramTerminal | None = None, protected: HelperProtection | None = None, capture: bool = False,
        local_ports: tuple = (),
        unix_allow: list[tuple[str, str]] = (), secret_ports: tuple = ()) -> int:
    """P's whole life, its plan given at once; returns its exit code (the caller _exits with it)."""
    plan = helper_plan.Plan(env=env, files=files, protected=protected, capture=capture,
                            local_ports=tuple(local_ports), unix_allow=tuple(unix_allow),
                            secret_ports=tuple(secret_ports))
    return run_planned(argv, handoff_fd, status_fd, go_fd, allow_unix_sockets, tty, lambda: plan)


def run_planned(argv: list[str], handoff_fd: int, status_fd: int, go_fd: int,
                allow_unix_sockets: bool, tty: ProgramTerminal | None,
                next_plan: Callable[[], helper_plan.Plan | None]) -> int:
    """P's whole life; returns its exit code (the caller _exits with it).
    What needs no policy (the imports, the seccomp filter) is done first;
    then next_plan() gives the rest (stages/wire/helper_plan.py): None when
    vpnw sent none (it refused the run or died), and then the helper exits
    having made nothing (docs/architecture.md, "Start-up budget")."""
    if not argv:
        st.write(status_fd, st.ExecFailed("no program given", ExitCode.NOT_FOUND))
        return ExitCode.NOT_FOUND
    mark("helper", "imported")
    # The orchestrator forwards these to us once the program runs; until init
    # exists to pass them on, they must not kill the helper (and so the run).
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    started = _until_the_plan(allow_unix_sockets, status_fd, next_plan)
    if not isinstance(started, tuple):
        return started
    early, plan = started
    files, protected, local_ports = plan.files, plan.protected, plan.local_ports
    penv = program_env(dict(os.environ if plan.env is None else plan.env))
    try:
        sealed = _seal(early, plan.unix_allow, plan.capture, local_ports, tty, status_fd,
                       plan.secret_ports)
    except SealError as e:
        st.write(status_fd, st.SandboxFailed(str(e), ExitCode.NO_SANDBOX))
        return ExitCode.NO_SANDBOX

    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    # vpnw's go pipe itself goes down to the program's process: vpnw's go
    # (status.GO) is a byte for us and one for it (no hop through us).
    keep = {report_w, go_fd}
    unix_link = sealed.unix_link
    if unix_link is not None:
        keep.add(unix_link.program_end.fileno())
    init_pid = os.fork()
    if init_pid == 0:
        os._exit(init_life(argv, penv, sealed.seccomp_bpf, report_w, go_fd, keep, files,
                           tty is not None, protected,
                           unix_link.program_end.fileno() if unix_link else None, plan.held))
    os.close(report_w)
    if unix_link is not None:
        unix_link.program_end.close()
    mark("helper", "init forked")
    report = st.StatusReader(report_r, st.INIT_REPORT)
    first = _next_report(report)
    mark("helper", "init ready")
    if isinstance(first, st.SandboxFailed):     # init could not give the program its terminal
        st.write(status_fd, first)
        reap(init_pid)
        return first.code
    if not isinstance(first, st.InitOk):
        why = first.error if isinstance(first, st.InitFailed) else \
            "the sandbox's init process died while starting"
        st.write(status_fd, st.SandboxFailed(f"{why}; {DOCTOR_HINT}", ExitCode.NO_SANDBOX))
        reap(init_pid)
        return ExitCode.NO_SANDBOX

    _hand_doors_over(handoff_fd, sealed)
    # Counted before Ready: once go is written the program may run before we
    # read our byte (the seal's own checks are not the program's).
    before = no_route_count(sealed.counters)
    st.write(status_fd, st.Ready(namespaces=tuple(priv.NAMESPACE_NAMES), seccomp=True,
                                 unix_sockets=allow_unix_sockets,
                                 unix="all" if allow_unix_sockets else
                                 "none" if sealed.unix is None else "own",
                                 doors=tuple(sealed.opened.items()), local=tuple(local_ports)))
    mark("helper", "Ready sent")
    collect_from_now()
    if not go_byte(go_fd):
        return ExitCode.NO_SANDBOX  # the orchestrator gave up; init dies with us (pdeathsig)
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, lambda s, _f: kill_quietly(init_pid, s))
    mark("helper", "go")
    os.close(go_fd)
    return _the_end(report, status_fd, init_pid, sealed, before, handoff_fd)


def _until_the_plan(allow_unix_sockets: bool, status_fd: int,
                    next_plan: Callable[[], helper_plan.Plan | None]):
    """What needs no policy, then the plan: (the _Early, the plan), or the
    exit code when the filter cannot be made or no plan came."""
    try:
        early = _before_the_plan(allow_unix_sockets)
    except SealError as e:
        st.write(status_fd, st.SandboxFailed(str(e), ExitCode.NO_SANDBOX))
        return ExitCode.NO_SANDBOX
    # Marked before the wait: when it comes before vpnw's "plan sent", the
    # helper's own start was off the critical path.
    mark("helper", "waiting for the plan")
    plan = next_plan()
    if plan is None:
        return ExitCode.NO_SANDBOX     # no namespace, no process made yet: nothing is left
    mark("helper", "plan read")
    return early, plan


class _Sealed(NamedTuple):
    """What the seal made, for the rest of the helper's life."""
    seccomp_bpf: bytes           # the filter's BPF program (seccomp_rules.filter_bpf)
    unix: object                 # the Unix-socket plan (None: every Unix socket refused)
    unix_link: object
    supervisor: object
    counters: object             # the sandbox network's no-route counters
    opened: dict                 # door -> port
    doors: list                  # (door, listening socket)
    datagram_doors: list


class _Early(NamedTuple):
    """What the helper made before the plan: nothing that needs the policy."""
    allow_unix_sockets: bool
    supervised: bool             # the Unix-socket supervisor can run (and will)
    seccomp_bpf: bytes


def _before_the_plan(allow_unix_sockets: bool) -> _Early:
    """The seccomp filter, and the modules the rest needs; no namespace yet
    (the [unix] allow sockets are stat-ed as vpnw's user, before the user
    namespace). SealError when the filter cannot be made."""
    # Before unshare: pyseccomp looks libseccomp up by running ldconfig, and
    # a process spawned after unshare(CLONE_NEWPID) would become the new
    # namespace's PID 1 and spend it.
    # The filter's BPF is made once, here, and so are the means to load it:
    # the program's process, forked from init after go, only loads the bytes
    # (libseccomp's own load made the BPF again there).
    # libseccomp's BPF for these rules made at install (seccomp_cache.py) is
    # used when its key matches; else libseccomp (through pyseccomp) makes it.
    try:
        supervised = _supervised(allow_unix_sockets)
        seccomp_bpf = seccomp_cache.cached_bpf(allow_unix_sockets, supervised)
        if seccomp_bpf is None:
            import_pyseccomp()
            seccomp_bpf = seccomp_rules.filter_bpf(allow_unix_sockets, supervised=supervised)
        seccomp_rules.loader()
    except (ImportError, OSError, RuntimeError, ValueError) as e:
        raise SealError(f"cannot build the seccomp filter (libseccomp via pyseccomp): {e}; "
                        f"{DOCTOR_HINT}")
    mark("helper", "seccomp filter built")
    return _Early(allow_unix_sockets, supervised, seccomp_bpf)


def _seal(early: _Early, unix_allow, capture: bool, local_ports: tuple,
          tty: ProgramTerminal | None, status_fd: int, secret_ports: tuple = ()) -> _Sealed:
    """Namespaces, the network check, the doors, the terminal; SealError when any fails."""
    unix = _unix_plan(early.allow_unix_sockets, unix_allow, early.supervised)
    seccomp_bpf = early.seccomp_bpf
    # The PID namespace comes last, once the Unix-socket supervisor is
    # forked: outside it, the program cannot see or signal the supervisor.
    _unshare_and_map(priv.SANDBOX_NAMESPACES & ~priv.CLONE_NEWPID)
    mark("helper", "namespaces made")
    # Non-dumpable: a program that somehow saw us could not ptrace us and
    # borrow the handoff socket. Children (init) inherit it.
    priv.prctl(priv.PR_SET_DUMPABLE, 0)
    unix_link = _unix_link(unix)
    opened = handoff.doors(capture)
    supervisor = _spawn_supervisor(unix_link, unix, status_fd,
                                   listened=(*opened.values(), *local_ports, *secret_ports))
    mark("helper", "supervisor started")
    _unshare_pid()
    check_network(capture)
    mark("helper", "network sealed")
    # Opened now, while /proc is still the machine's: init mounts a fresh one.
    counters = open_counters()
    # A `localhost:PORT` rule: a door on that port (docs/architecture.md,
    # "The machine's own loopback").
    # A secret: a door on its own port (docs/secrets.md).
    doors = open_doors([*opened.items(), *(("local", port) for port in local_ports),
                        *(("secret", port) for port in secret_ports)])
    datagram_doors = open_dns_datagrams() if capture else []
    mark("helper", "doors open")
    fresh_devpts()
    if tty is not None:
        own_terminal(tty.socket_fd, tty.stdio)
    mark("helper", "devpts")
    return _Sealed(seccomp_bpf, unix, unix_link, supervisor, counters, opened, doors,
                   datagram_doors)


def _hand_doors_over(handoff_fd: int, sealed: _Sealed) -> None:
    """The doors go to the broker before the program can knock: it accepts on
    them itself (handoff.py). Our copies close; the broker's keep them open.
    A link that fails here is vpnw's own failure (125, never "no sandbox"),
    reported by run_helper, and the program never starts."""
    try:
        with socket.socket(fileno=os.dup(handoff_fd)) as link:
            for door, lsock in sealed.doors:
                handoff.send_door(link, door, lsock.fileno())
            for usock in sealed.datagram_doors:
                handoff.send_datagram_door(link, usock.fileno())
    finally:
        for _door, lsock in sealed.doors:
            lsock.close()
        for usock in sealed.datagram_doors:
            usock.close()


def _the_end(report, status_fd: int, init_pid: int, sealed: _Sealed, before: int,
             handoff_fd: int) -> int:
    """The program's end, reported once; returns its exit code."""
    final = _wait_for_the_end(report, status_fd)
    mark("helper", "init's last report")
    # The program has ended: the link's end tells the broker to wind down
    # (take what the doors' backlogs hold, then its totals) while init and
    # the supervisor are reaped, not after (docs/architecture.md, "Start-up
    # budget"). Whatever of the sandbox still lives dies with init now; a
    # connection it makes after the doors close is refused, never unrecorded.
    os.close(handoff_fd)
    status = reap(init_pid)
    mark("helper", "init reaped")
    if sealed.supervisor is not None:
        # Its last reports come before our last message; once every process
        # of the sandbox is gone, it ends by itself.
        _reap_supervisor(sealed.supervisor)
        mark("helper", "supervisor reaped")
    no_route = max(0, no_route_count(sealed.counters) - before)
    if isinstance(final, st.Exited):
        final = st.Exited(final.code, final.signal, no_route=no_route)
    if isinstance(final, (st.ExecFailed, st.SandboxFailed, st.Exited)):
        st.write(status_fd, final)
        return final.code
    # init died without a word (killed from outside), or said what it does
    # not say at the end: report what its exit status shows.
    code, sig = decode_status(status)
    st.write(status_fd, st.Exited(code, sig, no_route=no_route))
    return code


def _supervised(allow_unix_sockets: bool) -> bool:
    """The Unix-socket supervisor can run (then own sockets are allowed):
    not with --allow-unix-sockets, nor on a kernel that lacks what it needs."""
    return not allow_unix_sockets and launch.missing() is None


def _unix_plan(allow_unix_sockets: bool, unix_allow: list[str], supervised: bool | None = None):
    """The sockets the policy names, when the supervisor can run (then own
    sockets are allowed); None: every Unix socket stays refused as before
    (--allow-unix-sockets, or a kernel that lacks what the supervisor needs).
    `supervised`: _supervised's answer, when already asked."""
    if not (_supervised(allow_unix_sockets) if supervised is None else supervised):
        return None
    return launch.named_sockets(unix_allow)


def _unix_link(unix):
    if unix is None:
        return None
    try:
        return launch.link()
    except OSError as e:
        raise SealError(f"cannot prepare the Unix-socket supervisor: {e}; {DOCTOR_HINT}")


def _spawn_supervisor(unix_link, named, status_fd: int, listened: tuple = ()) -> int | None:
    """`listened`: the doors' ports, which the supervisor treats as listened
    on from the start (supervisor/shell.py's Supervisor)."""
    if unix_link is None:
        return None

    def report(r: Report | RefusedLoopbackConnect) -> None:
        if isinstance(r, RefusedLoopbackConnect):
            st.write(status_fd, st.LoopbackRefused(port=r.port, process=r.process, program=r.program))
            return
        st.write(status_fd, st.UnixConnect(path=r.path, allowed=r.allowed, process=r.process,
                                           program=r.program, reason=r.reason))
    try:
        return launch.spawn(unix_link, named, status_fd, report, listened)
    except OSError as e:
        raise SealError(f"cannot start the Unix-socket supervisor: {e}; {DOCTOR_HINT}")


def _unshare_pid() -> None:
    try:
        priv.unshare(priv.CLONE_NEWPID)
    except OSError as e:
        raise SealError(f"cannot create the sandbox's PID namespace: {os.strerror(e.errno)}; "
                        f"{DOCTOR_HINT}")


def _reap_supervisor(pid: int) -> None:
    """Wait for the supervisor (it ends when no process uses the filter any
    more); one that does not within 5 s is killed."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        reap(pid)
        return
    try:
        if not select.select([fd], [], [], 5)[0]:
            kill_quietly(pid, signal.SIGKILL)
    finally:
        os.close(fd)
    reap(pid)


def _next_report(report: st.StatusReader) -> st.Message | None:
    """Init's next message; None when it ended or said something it does not
    say (then what init's exit status shows is all there is to report)."""
    try:
        return report.next_message()
    except st.StatusError:
        report.eof = True
        return None


def _wait_for_the_end(report: st.StatusReader, status_fd: int) -> st.Message | None:
    """Pass the program's stops on until init reports the end. Returns init's
    last message, or None when init ended without one."""
    while (message := _next_report(report)) is not None:
        if not isinstance(message, st.Stopped):
            return message
        st.write(status_fd, message)
    return None

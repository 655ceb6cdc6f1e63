"""The helper's process shell: seal (P), init (C, PID 1 inside), program (G).

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
"""
from __future__ import annotations

import errno
import gc
import os
import signal
import socket
import stat
import sys

from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.startup.imports import import_pyseccomp
from stages.wire import handoff
from stages.kernel.descriptors import close_all_but
from stages.wire import helper_plan
from stages.wire import status as st
from stages.wire.exits import ExitCode, killed_by
from stages.kernel import mounts
from stages.kernel import privileges as priv
from stages.wire.pty_handoff import ProgramTerminal, send_master
from stages.startup.trace import mark

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:   # annotations only: the helper imports no policy code at run time
    from typing import Callable

    from stages.config.file_limits import MountPlan
    from stages.config.protected import HelperProtection

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                     signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
DOCTOR_HINT = "run `vpnw doctor` to see what this machine supports"


class SealError(Exception):
    """The sandbox cannot be built; the message says what is missing."""


def program_env(env: dict[str, str]) -> dict[str, str]:
    """docs/architecture.md, "The sandbox", 5: the caller's env with the doors' settings and each client's
    own (stages/config/client_env.py). The orchestrator has usually applied it already;
    applying it again changes nothing."""
    from stages.config.client_env import apply
    return apply(env, python=sys.executable)[0]


def _read_byte(fd: int) -> bytes:
    while True:
        try:
            return os.read(fd, 1)
        except InterruptedError:
            continue
        except OSError:
            return b""


# ---------------------------------------------------------------- P: seal

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


def _check_network(capture: bool = False) -> None:
    from stages.helper import netlink
    try:
        netlink.bring_up("lo")
    except (OSError, netlink.NetlinkError) as e:
        raise SealError(f"cannot bring up or inspect the sandbox's loopback: {e}; {DOCTOR_HINT}")
    _loopback_congestion_control()
    if capture:
        _install_capture()
    try:
        links, routes = netlink.read_links_and_routes()
    except (OSError, netlink.NetlinkError) as e:
        raise SealError(f"cannot bring up or inspect the sandbox's loopback: {e}; {DOCTOR_HINT}")
    problems = netlink.seal_problems(links, routes, capture=capture)
    if problems:
        raise SealError("the sandbox's network is not sealed: " + "; ".join(problems))


# The sandbox's every TCP connection is on its own loopback (the program to
# a door): nothing is ever lost there, so congestion control has nothing to
# do, and a pacing one makes every tunnel slow. BBR, many machines' default
# and inherited by each new namespace, paces the broker's splice into the
# program's socket: curl's 1 GiB download through either door moved
# 0.68-0.70x of direct with it and 0.87-0.90x with reno, in the same bench
# rounds (docs/architecture.md, "Tunnel throughput: the bound"). reno is
# built into every kernel and is one a namespace's root may always make its
# default.
LOOPBACK_CONGESTION_CONTROL = b"reno"


def _loopback_congestion_control() -> None:
    """The sandbox's TCP default, set before the doors listen, so the
    doors' accepted sockets and the program's own all take it. /proc/sys/net
    is the writer's network namespace's: this one's. Where it cannot be
    written (a container with /proc/sys read-only) the run goes on with the
    machine's default: only speed is at stake."""
    try:
        fd = os.open("/proc/sys/net/ipv4/tcp_congestion_control", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, LOOPBACK_CONGESTION_CONTROL)
    except OSError:
        pass
    finally:
        os.close(fd)


def _install_capture() -> None:
    """The routes and nftables table capture needs (stages/helper/capture.py),
    checked before anything listens; a run that asked for capture never goes
    on without it."""
    from stages.helper import capture
    try:
        capture.install(handoff.CAPTURE_DOORS["capture"], handoff.DNS_PORT)
        capture.bind_resolv_conf()
    except capture.CaptureError as e:
        raise SealError(f"capture cannot work here: {e}; {DOCTOR_HINT}")
    except OSError as e:
        raise SealError(f"capture cannot work here: cannot point /etc/resolv.conf at the DNS "
                        f"door: {e}; {DOCTOR_HINT}")


def _open_doors(opened: list[tuple[str, int]]) -> list[tuple[str, socket.socket]]:
    doors = []
    try:
        for door, port in opened:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", port))
            s.listen(4096)    # the kernel caps it at net.core.somaxconn
            s.setblocking(False)
            doors.append((door, s))
    except OSError as e:
        raise SealError(f"cannot listen on the doors: {e.strerror}")
    # [::1] too, for programs that resolve "localhost" to ::1 first. A kernel
    # without IPv6 simply has no ::1 to reach, so that is not an error.
    for door, port in opened:
        try:
            s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(("::1", port))
            s.listen(4096)    # the kernel caps it at net.core.somaxconn
            s.setblocking(False)
            doors.append((door, s))
        except OSError:
            break
    return doors


def _open_dns_datagrams() -> list[socket.socket]:
    """The DNS door's UDP side, 127.0.0.1:53 and [::1]:53 (handed to the broker)."""
    socks = []
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((address, handoff.DNS_PORT))
        except OSError as e:
            s.close()
            if family == socket.AF_INET6:
                break
            raise SealError(f"cannot listen on the DNS door (UDP {address}:53): {e.strerror}")
        s.setblocking(False)
        socks.append(s)
    return socks


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
        os._exit(_init(argv, penv, sealed.seccomp_bpf, report_w, go_fd, keep, files,
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
        _reap(init_pid)
        return first.code
    if not isinstance(first, st.InitOk):
        why = first.error if isinstance(first, st.InitFailed) else \
            "the sandbox's init process died while starting"
        st.write(status_fd, st.SandboxFailed(f"{why}; {DOCTOR_HINT}", ExitCode.NO_SANDBOX))
        _reap(init_pid)
        return ExitCode.NO_SANDBOX

    _hand_doors_over(handoff_fd, sealed)
    # Counted before Ready: once go is written the program may run before we
    # read our byte (the seal's own checks are not the program's).
    before = _no_route_count(sealed.counters)
    st.write(status_fd, st.Ready(namespaces=tuple(priv.NAMESPACE_NAMES), seccomp=True,
                                 unix_sockets=allow_unix_sockets,
                                 unix="all" if allow_unix_sockets else
                                 "none" if sealed.unix is None else "own",
                                 doors=tuple(sealed.opened.items()), local=tuple(local_ports)))
    mark("helper", "Ready sent")
    collect_from_now()
    if not _go_byte(go_fd):
        return ExitCode.NO_SANDBOX  # the orchestrator gave up; init dies with us (pdeathsig)
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, lambda s, _f: _kill_quietly(init_pid, s))
    mark("helper", "go")
    os.close(go_fd)
    return _the_end(report, status_fd, init_pid, sealed, before, handoff_fd)


def collect_from_now() -> None:
    """The garbage collector on again in a process of the helper's, off since
    its fork (main.py): until Ready the helper, init and the program only
    import and build, and a collection there found nothing to free while it
    walked (and so copied, after the fork) every object made so far. What
    exists now lives as long as the process, so it is frozen out of the
    collector's sight first (gc.freeze, as vpnw does before its forks)."""
    gc.freeze()
    gc.enable()


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
        from stages.helper import seccomp_cache, seccomp_rules
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
    # Loaded now, while vpnw still loads the policy: the rest uses them.
    from stages.config import client_env  # noqa: F401
    from stages.helper import netlink  # noqa: F401
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
    _check_network(capture)
    mark("helper", "network sealed")
    # Opened now, while /proc is still the machine's: init mounts a fresh one.
    counters = _open_counters()
    # A `localhost:PORT` rule: a door on that port (docs/architecture.md,
    # "The machine's own loopback").
    # A secret: a door on its own port (docs/secrets.md).
    doors = _open_doors([*opened.items(), *(("local", port) for port in local_ports),
                         *(("secret", port) for port in secret_ports)])
    datagram_doors = _open_dns_datagrams() if capture else []
    mark("helper", "doors open")
    _fresh_devpts()
    if tty is not None:
        _own_terminal(tty.socket_fd, tty.stdio)
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
    status = _reap(init_pid)
    mark("helper", "init reaped")
    if sealed.supervisor is not None:
        # Its last reports come before our last message; once every process
        # of the sandbox is gone, it ends by itself.
        _reap_supervisor(sealed.supervisor)
        mark("helper", "supervisor reaped")
    no_route = max(0, _no_route_count(sealed.counters) - before)
    if isinstance(final, st.Exited):
        final = st.Exited(final.code, final.signal, no_route=no_route)
    if isinstance(final, (st.ExecFailed, st.SandboxFailed, st.Exited)):
        st.write(status_fd, final)
        return final.code
    # init died without a word (killed from outside), or said what it does
    # not say at the end: report what its exit status shows.
    code, sig = _decode_status(status)
    st.write(status_fd, st.Exited(code, sig, no_route=no_route))
    return code


def _supervised(allow_unix_sockets: bool) -> bool:
    """The Unix-socket supervisor can run (then own sockets are allowed):
    not with --allow-unix-sockets, nor on a kernel that lacks what it needs."""
    from stages.helper import unix_supervisor
    return not allow_unix_sockets and unix_supervisor.missing() is None


def _unix_plan(allow_unix_sockets: bool, unix_allow: list[str], supervised: bool | None = None):
    """The sockets the policy names, when the supervisor can run (then own
    sockets are allowed); None: every Unix socket stays refused as before
    (--allow-unix-sockets, or a kernel that lacks what the supervisor needs).
    `supervised`: _supervised's answer, when already asked."""
    if not (_supervised(allow_unix_sockets) if supervised is None else supervised):
        return None
    from stages.helper import unix_supervisor
    return unix_supervisor.named_sockets(unix_allow)


def _unix_link(unix):
    if unix is None:
        return None
    from stages.helper import unix_supervisor
    try:
        return unix_supervisor.link()
    except OSError as e:
        raise SealError(f"cannot prepare the Unix-socket supervisor: {e}; {DOCTOR_HINT}")


def _spawn_supervisor(unix_link, named, status_fd: int, listened: tuple = ()) -> int | None:
    """`listened`: the doors' ports, which the supervisor treats as listened
    on from the start (unix_supervisor.Supervisor)."""
    if unix_link is None:
        return None
    from stages.helper import unix_supervisor

    def report(r: unix_supervisor.Report | unix_supervisor.RefusedLoopbackConnect) -> None:
        if isinstance(r, unix_supervisor.RefusedLoopbackConnect):
            st.write(status_fd, st.LoopbackRefused(port=r.port, process=r.process, program=r.program))
            return
        st.write(status_fd, st.UnixConnect(path=r.path, allowed=r.allowed, process=r.process,
                                           program=r.program, reason=r.reason))
    try:
        return unix_supervisor.spawn(unix_link, named, status_fd, report, listened)
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
    import select
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        _reap(pid)
        return
    try:
        if not select.select([fd], [], [], 5)[0]:
            _kill_quietly(pid, signal.SIGKILL)
    finally:
        os.close(fd)
    _reap(pid)


def _open_counters() -> list[int]:
    """The sandbox network's counters (the helper is in that namespace)."""
    fds = []
    for name in ("/proc/self/net/snmp", "/proc/self/net/snmp6"):
        try:
            fds.append(os.open(name, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            fds.append(-1)
    return fds


def _no_route_count(counters: list[int]) -> int:
    """Sends and connects the sandbox's network refused for want of a route:
    each is the program trying a way out other than the doors. The kernel
    counts them; 0 if they cannot be read."""
    texts = []
    for fd in counters:
        try:
            texts.append(os.pread(fd, 65536, 0).decode("ascii", "replace") if fd >= 0 else "")
        except OSError:
            texts.append("")
    return no_routes(*texts)


def no_routes(snmp: str, snmp6: str) -> int:
    """Ip: OutNoRoutes (a header line, then a values line) plus Ip6OutNoRoutes."""
    total = 0
    ip = [line.split() for line in snmp.splitlines() if line.startswith("Ip: ")]
    if len(ip) >= 2 and "OutNoRoutes" in ip[0] and len(ip[1]) == len(ip[0]):
        total += int(ip[1][ip[0].index("OutNoRoutes")])
    for line in snmp6.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "Ip6OutNoRoutes" and words[1].isdigit():
            total += int(words[1])
    return total


def _next_report(report: st.StatusReader) -> st.Message | None:
    """Init's next message; None when it ended or said something it does not
    say (then what init's exit status shows is all there is to report)."""
    try:
        return report.next_message()
    except st.StatusError:
        report.eof = True
        return None


_TIOCGPTN, _TIOCSPTLCK = 0x80045430, 0x40045431


def _fresh_devpts() -> None:
    try:
        mounts.mount_fresh_devpts()
    except OSError as e:
        raise SealError(f"cannot mount a devpts of the sandbox's own over /dev/pts: {e}; "
                        f"{DOCTOR_HINT}")


def _own_terminal(pty_sock_fd: int, stdio: tuple[bool, bool, bool]) -> None:
    """The program's terminal, made in the sandbox's own devpts, so its name
    is there inside (ttyname(), `tty`). The master goes to the orchestrator
    over `pty_sock_fd`; the slave becomes each of fds 0-2 of this process
    that `stdio` marks (the user's terminals: no fd of theirs is left), which
    init and the program inherit; the others (files, pipes) stay as they are."""
    import array
    import fcntl
    try:
        master = os.open("/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        fcntl.ioctl(master, _TIOCSPTLCK, array.array("i", [0]))
        number = array.array("I", [0])
        fcntl.ioctl(master, _TIOCGPTN, number)
        slave = os.open(f"/dev/pts/{number[0]}", os.O_RDWR | os.O_NOCTTY)
        for fd in (0, 1, 2):
            if stdio[fd] or os.isatty(fd):
                os.dup2(slave, fd)
        os.close(slave)
        with socket.socket(fileno=pty_sock_fd) as sock:
            send_master(sock, master)
        os.close(master)
    except OSError as e:
        raise SealError(f"cannot open the program's terminal in the sandbox: {e}")


def _go_byte(go_fd: int) -> bool:
    return _read_byte(go_fd) != b""


def _kill_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


def _decode_status(status: int) -> tuple[int, int | None]:
    if os.WIFSIGNALED(status):
        return killed_by(os.WTERMSIG(status)), os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status), None


def _wait_for_the_end(report: st.StatusReader, status_fd: int) -> st.Message | None:
    """Pass the program's stops on until init reports the end. Returns init's
    last message, or None when init ended without one."""
    while (message := _next_report(report)) is not None:
        if not isinstance(message, st.Stopped):
            return message
        st.write(status_fd, message)
    return None


# ---------------------------------------------------------------- C: init

def _init(argv, penv, seccomp_bpf: bytes, report_w: int, go_r: int, keep: set[int],
          files: MountPlan | None = None, tty: bool = False, protected: HelperProtection | None = None,
          listener_end: int | None = None, held: helper_plan.HeldPlan | None = None) -> int:
    try:
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        # If the helper dies, init dies, and with PID 1 the whole namespace.
        priv.prctl(priv.PR_SET_PDEATHSIG, signal.SIGKILL)
        priv.prctl(priv.PR_SET_DUMPABLE, 0)
        close_all_but(keep)
        priv.mount("proc", "/proc", "proc", priv.MS_NOSUID | priv.MS_NODEV | priv.MS_NOEXEC)
        mark("init", "fresh /proc")
    except OSError as e:
        st.write(report_w, st.InitFailed(f"cannot set up the sandbox's init (fresh /proc): {e}"))
        return ExitCode.NO_SANDBOX
    try:
        _read_only_kernel_knobs()
    except OSError as e:
        st.write(report_w, st.InitFailed(f"cannot make /proc/sys, /proc/irq, /proc/bus, /proc/fs and /sys "
                                              f"read-only or mask /proc/kcore and its kind: {e}"))
        return ExitCode.NO_SANDBOX
    mark("init", "kernel knobs read-only")
    try:
        _limit_files(files, held)
    except OSError as e:
        what = "make the run's held layer" if held else "enforce the policy's [files] limits"
        st.write(report_w, st.InitFailed(f"cannot {what}: {e}"))
        return ExitCode.NO_SANDBOX
    mark("init", "file limits")
    problem = _out_of_program_reach(protected.read_only, protected.hide) if protected else None
    mark("init", "protected paths bound read-only")
    if problem:
        st.write(report_w, st.InitFailed(problem))
        return ExitCode.NO_SANDBOX
    if tty:
        try:
            _lead_terminal_session()
        except OSError as e:
            st.write(report_w, st.SandboxFailed(f"cannot give the program its terminal: {e}",
                                                ExitCode.INTERNAL))
            return ExitCode.INTERNAL
    st.write(report_w, st.InitOk())
    # The program's process is forked and sealed now, while the helper
    # reports ready and vpnw answers; it waits for go itself and then only
    # execs (docs/architecture.md, "The sandbox", 4). Before go nothing of
    # the program runs: go's EOF ends that process unexec'd.
    try:
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        program_pid = os.fork()
    except OSError as e:
        st.write(report_w, st.SandboxFailed(f"cannot start the program's process: {e}",
                                            ExitCode.INTERNAL))
        return ExitCode.INTERNAL
    if program_pid == 0:
        _program(argv, penv, seccomp_bpf, err_w, go_r, files, tty, listener_end)  # never returns
    mark("init", "program forked")
    collect_from_now()
    os.close(err_w)
    os.close(go_r)
    if listener_end is not None:
        os.close(listener_end)
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, lambda s, _f: _kill_quietly(program_pid, s))

    failure = b""
    while True:
        try:
            chunk = os.read(err_r, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        failure += chunk
    os.close(err_r)
    status = _wait_for(program_pid, report_w if tty else None)
    mark("init", "program reaped")
    if failure:
        try:
            report = st.decode(failure.rstrip(b"\n"), st.PROGRAM_REPORT)
        except st.StatusError:
            report = st.ExecFailed("the program could not be started", ExitCode.CANNOT_EXECUTE)
        st.write(report_w, report)
        return report.code
    code, sig = _decode_status(status)
    st.write(report_w, st.Exited(code, sig))
    return code


def _read_only_kernel_knobs() -> None:
    """Sysctls, sysrq and sysfs check the uid (0 = the machine's root), not
    capabilities: a program run as root would keep writing them after the
    drop, e.g. kernel.core_pattern = "|prog", which the kernel then runs as
    root outside every namespace. Read-only bind mounts close that."""
    for knob in ("/proc/sys", "/proc/sysrq-trigger"):
        if os.path.exists(knob):
            priv.mount(knob, knob, None, mounts.MS_BIND | priv.MS_REC)
    for point in ["/proc/sys", "/proc/sysrq-trigger", *mounts.mount_points_under("/sys")]:
        if os.path.exists(point):
            mounts.read_only(point)
    _docker_default_proc_masks()


# Docker's defaults (moby oci/defaults.go, DefaultLinuxSpec): readonlyPaths
# (/proc/sys and /proc/sysrq-trigger are done above) and maskedPaths, plus
# /sys/devices/virtual/powercap, which newer moby and containerd mask too
# (RAPL energy counters, CVE-2020-8694). These files check the uid, or
# nothing at all (PCI config space), not capabilities: root inside could
# write /proc/irq/*/smp_affinity or a device's config space, or read the
# kernel's memory image, timers and keys.
DOCKER_READ_ONLY = ("/proc/bus", "/proc/fs", "/proc/irq")
DOCKER_MASKED = ("/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                 "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
                 "/sys/firmware", "/sys/devices/virtual/powercap")


def _docker_default_proc_masks() -> None:
    for top in DOCKER_READ_ONLY:
        if os.path.exists(top):
            priv.mount(top, top, None, mounts.MS_BIND | priv.MS_REC)
            for point in mounts.mount_points_under(top):
                mounts.read_only(point)
    for point in DOCKER_MASKED:
        if os.path.isdir(point):
            # An empty read-only tmpfs, as runc masks a directory.
            priv.mount("tmpfs", point, "tmpfs",
                       mounts.MS_RDONLY | priv.MS_NOSUID | priv.MS_NODEV | priv.MS_NOEXEC)
        elif os.path.exists(point):
            priv.mount("/dev/null", point, None, mounts.MS_BIND)


def _out_of_program_reach(paths: list[str], secrets: list[list[str]] = ()) -> str | None:
    """What runs outside the sandbox later (stages/config/protected.py) and the
    record, which is evidence (docs/security.md): vpnw's installation, its
    state directory, the record, the policy and the config, the shell's and
    git's start-up files... are read-only in the program's mount namespace,
    and the secret files the config names are hidden (an empty file or
    directory over them). Done last, after the file limits, so that no
    allow_write can make them writable again (a policy lifts one only by
    naming it: the orchestrator then leaves it out). Each is bound onto
    itself and remounted read-only (the program has no CAP_SYS_ADMIN to undo
    it, and no new user namespace to get one); the seal check is statvfs's
    ST_RDONLY through the path the program will use. None, or why not."""
    cwd = os.getcwd()
    try:
        pinned = _pin_above(paths)
        # Sorted once: the mount points below a path are one run of them
        # (bisect; a scan of every point for every path was quadratic: ~0.1 s
        # at 700 paths). No protected path lies below another (protected.py's
        # _outermost), so the binds made here add none below a later one.
        points = sorted(set(mounts.mount_points_under("/")))
        for path in paths:
            try:
                real = os.path.realpath(path, strict=True)
            except (FileNotFoundError, NotADirectoryError):
                continue   # hidden by a deny_read limit: out of reach already
            except PermissionError:
                continue   # unreachable for this user, so for the program too
            priv.mount(real, real, None, mounts.MS_BIND | priv.MS_REC)
            for point in [real, *_points_below(points, real)]:
                try:
                    mounts.read_only(point)
                except PermissionError:
                    pass   # below a directory this user cannot enter
        if secrets:
            from stages.helper import file_mounts
            file_mounts.hide(secrets)
        # A cwd inside a protected directory still points at the mount below.
        os.chdir(cwd)
        problem = _still_shown(secrets) or _not_pinned(paths, pinned)
        if problem:
            return problem
        for path in paths:
            try:
                writable = not os.statvfs(path).f_flag & _ST_RDONLY
            except OSError:
                continue
            if writable:
                return f"{path} is still writable after its read-only bind"
    except OSError as e:
        return (f"cannot make vpnw's installation and evidence, and the files that run "
                f"outside the sandbox later, read-only for the program: {e}")
    return None


_ST_RDONLY = 1


def _points_below(points: list[str], top: str) -> list[str]:
    """The mount points strictly below `top` in the sorted `points`."""
    import bisect
    prefix = top.rstrip("/") + "/"
    out = []
    for point in points[bisect.bisect_left(points, prefix):]:
        if not point.startswith(prefix):
            break
        out.append(point)
    return out


def _pin_above(paths: list[str]) -> list[str]:
    """Each directory above a protected path, up to `/`, made a mount point
    (those not one already), so that no rename moves the path
    (stages/helper/pins.py). Before the read-only binds: their mounts are
    then made once, on top, not copied by each pin."""
    from stages.helper import pins
    return pins.pin(paths)


def _not_pinned(paths: list[str], pinned: list[str]) -> str | None:
    """The pins' seal check: each protected path there and each directory
    pinned above it is a mount point in the program's namespace."""
    from stages.helper import pins
    there = [p for p in paths if os.path.lexists(p)]
    loose = pins.unpinned([*pinned, *there])
    if loose:
        return f"{loose[0]} is not a mount point after its pin: a rename could move it"
    return None


def _still_shown(hidden: list[list[str]]) -> str | None:
    """The seal check of what is hidden (a secret the config names, vpnw's
    signing key): through the path the program will use, an empty directory
    or an empty file."""
    for path, kind in hidden:
        try:
            shown = os.listdir(path) if kind == "dir" else os.stat(path).st_size
        except FileNotFoundError:
            continue
        if shown:
            return f"{path} still shows what it holds after its empty mount"
    return None


def _limit_files(files: MountPlan | None, held: helper_plan.HeldPlan | None = None) -> None:
    """The policy's [files] table: a minimal /dev (root could otherwise read
    disks, consoles and serial lines: device files check the uid, not
    capabilities), then the mount layer (stages/helper/file_mounts.py).
    The held layer (stages/helper/held_layer.py): every run without [files],
    and one whose [files] says outside = "held" (its deny_read hidden after)."""
    if files:
        from stages.helper import file_mounts
        mounts.minimal_dev()
        if held:
            from stages.helper import held_layer
            cwd = os.getcwd()
            held_layer.mount(held.dir, held.work, held.hide, held.anchors)
            file_mounts.hide(files.hide)
            os.chdir(cwd)    # a hidden cwd's old directory is below the new mount
        else:
            file_mounts.apply(files)
    elif held:
        from stages.helper import held_layer
        held_layer.mount(held.dir, held.work, held.hide, held.anchors)


def _wait_for(program_pid: int, stops_to: int | None = None) -> int:
    """Reap everything (we are PID 1) until the program itself ends. With
    `stops_to`, also report each time the program stops (Ctrl-Z on its pty),
    so vpnw can stop with it the way a shell job does."""
    flags = os.WUNTRACED if stops_to is not None else 0
    while True:
        try:
            pid, status = os.waitpid(-1, flags)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0
        if pid != program_pid:
            continue
        if os.WIFSTOPPED(status):
            st.write(stops_to, st.Stopped(os.WSTOPSIG(status)))
            continue
        return status


# ---------------------------------------------------------------- G: program

def _program(argv, penv, seccomp_bpf: bytes, err_w: int, go_r: int,
              files: MountPlan | None = None, tty: bool = False,
              listener_end: int | None = None) -> None:
    """Sealed first (before go), then go read, then exec; never returns."""
    try:
        for sig in FORWARDED_SIGNALS + (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE; programs expect the default
        if tty:
            _foreground_of_terminal()
        else:
            os.setsid()
        priv.prctl(priv.PR_SET_PDEATHSIG, signal.SIGKILL)
        close_all_but({err_w, go_r} if listener_end is None else {err_w, go_r, listener_end})
        priv.drop_all_privileges()
        if files and files.landlock_abi:
            # After no_new_privs (the drop), before the filter and exec.
            from stages.helper import landlock
            landlock.restrict_writes(files.writable, files.landlock_abi)
        if listener_end is None:
            from stages.helper.seccomp_rules import load_bpf
            load_bpf(seccomp_bpf)
        else:
            from stages.helper.unix_supervisor import hand_over_listener
            hand_over_listener(listener_end, seccomp_bpf)    # loads it, with its listener
    except BaseException as e:  # noqa: BLE001 - whatever went wrong, never exec unsealed
        _report_exec(err_w, st.SandboxFailed(f"cannot seal the program's process: {e}; "
                                             f"{DOCTOR_HINT}", ExitCode.NO_SANDBOX))
    mark("program", "sealed")
    if not _go_byte(go_r):
        os._exit(ExitCode.NO_SANDBOX)   # vpnw gave up before go: nothing of the program ran
    os.close(go_r)
    try:
        mark("program", "go, exec")
        os.execve(_search_path(argv[0], penv.get("PATH")), argv, penv)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            code, what = ExitCode.NOT_FOUND, "not found"
        else:
            code, what = ExitCode.CANNOT_EXECUTE, "cannot be executed"
        _report_exec(err_w, st.ExecFailed(f"{argv[0]}: {what} ({e.strerror})", code))


def _search_path(name: str, path: str | None) -> str:
    """The file PATH finds for `name`, as the shell searches: a directory that
    cannot be searched holds nothing (not found, 127, not "Permission
    denied"); a file there that is not executable is used only when no
    executable one comes later (then 126). OSError(ENOENT) when none."""
    if "/" in name:
        return name
    first = None
    for directory in (os.defpath if path is None else path).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        try:
            if not stat.S_ISREG(os.stat(candidate).st_mode):
                continue
        except OSError:
            continue
        if os.access(candidate, os.X_OK):
            return candidate
        first = first or candidate
    if first:
        return first
    raise FileNotFoundError(errno.ENOENT, "No such file or directory", name)


def _lead_terminal_session() -> None:
    """In init, with a terminal: one of fds 0-2 is the slave of the program's own pty
    (opened outside by the orchestrator). Init leads a new session with it
    as controlling terminal, so /dev/tty opens it inside and its line
    discipline sends Ctrl-C/Ctrl-Z/SIGWINCH to the program's foreground
    group and to nothing outside. Init, not the program, leads the session
    (as sudo's monitor does): a group whose parent is in another session is
    orphaned, and the kernel ignores Ctrl-Z for an orphaned group."""
    import fcntl
    import termios
    os.setsid()
    fcntl.ioctl(_slave_fd(), termios.TIOCSCTTY, 0)


def _slave_fd() -> int:
    """The first of fds 0-2 that is the pty's slave: every terminal among
    them is (_own_terminal), and stdin may be a file or /dev/null."""
    return next(fd for fd in (0, 1, 2) if os.isatty(fd))


def _foreground_of_terminal() -> None:
    """In the program, before exec: a process group of its own, made the
    terminal's foreground group (SIGTTOU ignored meanwhile: init's group
    holds the foreground until then)."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(_slave_fd(), os.getpgrp())
    finally:
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)


def _report_exec(err_w: int, report: st.Message) -> None:
    try:
        st.write(err_w, report)
    finally:
        os._exit(report.code)

"""The helper, forked first (docs/architecture.md, "Start-up budget").

Right after the command line is read, before the run's modules and the
policy load, vpnw plans the program's terminal and forks the helper: its
imports and the seccomp filter (stages/helper/seal.py, _before_the_plan)
run on the other core while vpnw loads the policy, opens the record and
computes the protection and the environment. Then vpnw sends the plan
(stages/wire/helper_plan.py) and the helper does the rest. A run refused
before the plan (a bad policy, an unwritable record or log, Ctrl-C) kills
and reaps the helper, which has made nothing yet (`abandon`); if vpnw dies,
the helper dies with it (PR_SET_PDEATHSIG), and the plan pipe's end makes
it exit anyway.

Light on purpose: it is imported before the fork, so only what the fork
needs (no dataclasses, no policy).
"""
from __future__ import annotations

import errno
import os
import signal
import sys

from stages.kernel.descriptors import close_all_but
from stages.startup import collector
from stages.startup.c_halves import seqpacket_pair
from stages.startup.trace import mark
from stages.wire.exits import ExitCode

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                     signal.SIGUSR1, signal.SIGUSR2)


def set_pdeathsig(sig: int) -> None:
    # In the forked stage, which loads it anyway (not on the way to the fork);
    # with ctypes (stages/kernel/privileges.py).
    from stages.kernel import privileges as priv
    priv.prctl(priv.PR_SET_PDEATHSIG, sig)


def fork_stage(keep: list[int], body, *, die_with_parent: bool = False,
               stdin_null: bool = True, stdio: tuple[int, int, int] | None = None,
               collect: bool = True) -> int:
    """Fork a child that keeps only fds 0-2 and `keep`, runs body() and exits with its code.

    `stdio`: the fds that become the child's 0, 1 and 2 (default: the orchestrator's).
    `collect`: the garbage collector on in the child (the helper's is off
    until its Ready: stages/helper/processes.py, collect_from_now)."""
    collector.freeze()      # what exists now, out of the stage's collections (collector.py)
    pid = os.fork()
    if pid:
        return pid
    code = ExitCode.INTERNAL
    try:
        if not collect:
            collector.pause()
        else:
            collector.resume()      # whatever paused it in vpnw (run_command.execute)
        # Terminal signals go to the orchestrator only; it forwards what it must.
        os.setpgid(0, 0)
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        if die_with_parent:
            set_pdeathsig(signal.SIGKILL)
        if stdio is not None:
            become_stdio(stdio)
        if stdin_null:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
        close_all_but(keep)
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else ExitCode.INTERNAL
    except BaseException as exc:  # noqa: BLE001 - a stage must never return into the parent's code
        try:
            sys.stderr.write(f"vpnw: internal error in stage: {exc!r}\n")
            sys.stderr.flush()
        except Exception:
            pass
    finally:
        os._exit(code if isinstance(code, int) else ExitCode.INTERNAL)


def become_stdio(stdio: tuple[int, int, int]) -> None:
    # Through fresh duplicates first, so that (a, b, c) = (1, 0, 2) cannot clobber itself.
    copies = [os.dup(fd) for fd in stdio]
    for target, fd in enumerate(copies):
        os.dup2(fd, target)
    for fd in copies:
        os.close(fd)


class Terminal:
    """Where the program's fds 0-2 and vpnw's human lines go (docs/architecture.md, "The terminal")."""

    def __init__(self, program_stdio: tuple[int, int, int], human_fd: int | None,
                 color: bool | None = None, pty: bool = False, program_out: int = 1,
                 on_tty: tuple = (False, False, False), no_clipboard: bool = False,
                 human_r: int | None = None, pty_socket=None, own_fds: list | None = None):
        self.program_stdio = program_stdio
        self.human_fd = human_fd      # the recorder's and the broker's fd 2 (None: the log, not open yet)
        self.color = color            # None: the recorder looks at its fd 2
        self.pty = pty                # the program gets a pty of its own
        self.program_out = program_out    # the user's fd the pty's output goes to
        self.on_tty = on_tty          # which of the program's fds 0-2 get the pty
        self.no_clipboard = no_clipboard  # the relay drops OSC 52 (--no-clipboard)
        self.human_r = human_r        # vpnw's lines, to merge into the program's output
        self.pty_socket = pty_socket  # (ours, the helper's): the pty master comes over it
        self.relay = None             # terminal.TerminalRelay once the master is here
        self.own_fds = own_fds if own_fds is not None else []   # closed after the forks


class RunRefused(Exception):
    """A run that cannot start as asked (exit 121); nothing was started."""


def open_log(path: str) -> int:
    # O_NOFOLLOW: a symlink planted at the log's name is refused, never followed.
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW,
                       0o600)
    except OSError as exc:
        why = "it is a symbolic link (vpnw never writes its log through one)" \
            if exc.errno == errno.ELOOP else exc.strerror
        raise RunRefused(f"--log {path}: cannot open it for writing: {why}") from None


def plan_terminal(record: str | None, log: str | None, no_clipboard: bool, env) -> Terminal:
    """The program's terminal, from the command line alone (the helper needs
    it at its fork). With --log, human_fd stays None until open_the_log."""
    # `--record -` puts the record on stdout, so the program's stdout goes to
    # stderr: the two streams never mix.
    program_out = 2 if record == "-" else 1
    human_fd = None if log else 2
    own = []
    # A pty whenever any of the program's fds 0-2 would be a terminal (sudo's
    # use_pty): the program never holds an fd of the user's terminal, so
    # `vpnw run -- agent < /dev/null &` cannot read the shell's keys nor leave
    # its modes behind. Only the terminal fds become the pty's slave; a file or
    # a pipe stays the program's own (the relay's modules load only here).
    on_tty = (os.isatty(0), os.isatty(program_out), os.isatty(2))
    if not any(on_tty):
        return Terminal(program_stdio=(0, program_out, 2), human_fd=human_fd, own_fds=own)
    human_r = None
    color = None
    # The pty's output (the program's terminal stdout/stderr, the echo of the
    # keys) goes to the user's terminal: where stdout goes, else stderr, else stdin.
    screen = program_out if on_tty[1] else 2 if on_tty[2] else 0
    if not log and on_tty[2]:
        # vpnw's lines are on the same screen as the program's: merge them.
        human_r, human_fd = os.pipe()
        own.append(human_fd)
        color = "NO_COLOR" not in env
    # A terminal's pair only: a run without one loads socket after the fork (startup/c_halves.py, seqpacket_pair)
    import socket
    ours, helpers = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # The helper replaces each of fds 0-2 that is a terminal with the pty's
    # slave before anything of the program's runs.
    return Terminal(program_stdio=(0, program_out, 2), human_fd=human_fd, color=color,
                    pty=True, program_out=screen, human_r=human_r,
                    pty_socket=(ours, helpers), own_fds=own, on_tty=on_tty,
                    no_clipboard=no_clipboard)


def open_the_log(terminal: Terminal, log: str | None) -> None:
    """--log's file as the human lines' fd (RunRefused when it cannot be)."""
    if log and terminal.human_fd is None:
        terminal.human_fd = open_log(log)
        terminal.own_fds.append(terminal.human_fd)


def close_terminal(terminal: Terminal) -> None:
    """What plan_terminal opened, on a run that ends before its relay."""
    if terminal.pty_socket is not None:
        for end in terminal.pty_socket:
            end.close()
        terminal.pty_socket = None
    for fd in (terminal.human_r, *terminal.own_fds):
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
    terminal.human_r, terminal.own_fds = None, []


class Helper:
    """The helper forked first, until its plan is sent (then plan_w is None)."""

    def __init__(self, pid: int, status_r: int, go_w: int, plan_w: int | None, broker_end):
        self.pid = pid
        self.status_r = status_r
        self.go_w = go_w
        self.plan_w = plan_w
        self.broker_end = broker_end     # the handoff link's far end (an fd), for the broker


def fork_helper(argv: list[str], allow_unix_sockets: bool, terminal: Terminal) -> Helper:
    """The helper (which builds the sandbox and runs the program), with the
    handoff link (stages/wire/handoff.py's link(): SOCK_SEQPACKET) whose far
    end goes to the broker, and the plan pipe."""
    helper_end, broker_end = seqpacket_pair()
    status_r, status_w = os.pipe()
    go_r, go_w = os.pipe()
    plan_r, plan_w = os.pipe()

    def helper_body():
        mark("helper", "forked")
        from stages.helper.main import run_helper_first     # in the helper: after the fork
        from stages.wire.pty_handoff import ProgramTerminal     # in the helper: after the fork
        run_helper_first(argv, handoff_fd=helper_end, status_fd=status_w, go_fd=go_r,
                         plan_fd=plan_r, allow_unix_sockets=allow_unix_sockets,
                         tty=ProgramTerminal(terminal.pty_socket[1].fileno(), stdio=terminal.on_tty)
                         if terminal.pty else None)
        return ExitCode.INTERNAL

    # The helper, its init and the program get the program's fds 0-2: with a
    # pty, nothing inside the sandbox holds the user's terminal.
    keep = [helper_end, status_w, go_r, plan_r]
    if terminal.pty:
        keep.append(terminal.pty_socket[1].fileno())
    pid = fork_stage(keep, helper_body, die_with_parent=True, stdin_null=False,
                     stdio=terminal.program_stdio, collect=False)
    for fd in (helper_end, status_w, go_r, plan_r):
        os.close(fd)
    mark("vpnw", "helper forked")
    return Helper(pid, status_r, go_w, plan_w, broker_end)


def send_plan(helper: Helper, plan) -> None:
    """The plan (stages/wire/helper_plan.py's Plan), then the pipe's end. A
    helper that is already gone (its seal failed) said why on its status
    pipe, which the run reads next."""
    from stages.wire import helper_plan     # after the helper's fork (the module's docstring)
    plan_w, helper.plan_w = helper.plan_w, None
    try:
        helper_plan.send(plan_w, plan)
    except BrokenPipeError:
        pass
    finally:
        # Marked before the close: the helper reads to the pipe's end, so
        # its "plan read" can come before vpnw runs again after the close.
        mark("vpnw", "plan sent")
        os.close(plan_w)


def abandon(helper: Helper | None) -> None:
    """A run refused before its plan was sent: the helper has made nothing
    (no namespace, no process), so it is killed and reaped, and its pipes
    closed. Nothing once the plan went (the run's own ending reaps it then)."""
    if helper is None or helper.plan_w is None:
        return
    os.close(helper.plan_w)
    helper.plan_w = None
    try:
        os.kill(helper.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(helper.pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            break
    for fd in (helper.status_r, helper.go_w, helper.broker_end):
        os.close(fd)

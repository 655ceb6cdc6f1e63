"""The program's terminal: a devpts of the sandbox's own, the pty made in
it by the seal (P, own_terminal), the session init leads with it
(lead_terminal_session), and the foreground group the program takes
before exec (foreground_of_terminal)."""
from __future__ import annotations

import fcntl
import os
import signal
import socket

from stages.helper.processes import DOCTOR_HINT, SealError
from stages.kernel import mounts
from stages.wire.pty_handoff import send_master

_TIOCGPTN, _TIOCSPTLCK = 0x80045430, 0x40045431


def fresh_devpts() -> None:
    try:
        mounts.mount_fresh_devpts()
    except OSError as e:
        raise SealError(f"cannot mount a devpts of the sandbox's own over /dev/pts: {e}; "
                        f"{DOCTOR_HINT}")


def own_terminal(pty_sock_fd: int, stdio: tuple[bool, bool, bool]) -> None:
    """The program's terminal, made in the sandbox's own devpts, so its name
    is there inside (ttyname(), `tty`). The master goes to the orchestrator
    over `pty_sock_fd`; the slave becomes each of fds 0-2 of this process
    that `stdio` marks (the user's terminals: no fd of theirs is left), which
    init and the program inherit; the others (files, pipes) stay as they are."""
    # A run with a terminal alone: array's import brings collections.abc
    # (~4 ms in a process that has not loaded it), kept off every other run.
    import array
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


def lead_terminal_session() -> None:
    """In init, with a terminal: one of fds 0-2 is the slave of the program's own pty
    (made inside, in the sandbox's devpts, by the seal: own_terminal). Init leads a new session with it
    as controlling terminal, so /dev/tty opens it inside and its line
    discipline sends Ctrl-C/Ctrl-Z/SIGWINCH to the program's foreground
    group and to nothing outside. Init, not the program, leads the session
    (as sudo's monitor does): a group whose parent is in another session is
    orphaned, and the kernel ignores Ctrl-Z for an orphaned group."""
    import termios      # a run with a terminal alone: a library of its own to load
    os.setsid()
    fcntl.ioctl(_slave_fd(), termios.TIOCSCTTY, 0)


def _slave_fd() -> int:
    """The first of fds 0-2 that is the pty's slave: every terminal among
    them is (own_terminal), and stdin may be a file or /dev/null."""
    return next(fd for fd in (0, 1, 2) if os.isatty(fd))


def foreground_of_terminal() -> None:
    """In the program, before exec: a process group of its own, made the
    terminal's foreground group (SIGTTOU ignored meanwhile: init's group
    holds the foreground until then)."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(_slave_fd(), os.getpgrp())
    finally:
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)


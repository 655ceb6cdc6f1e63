"""The program's terminal: what the orchestrator asks of the helper, and the
pty master the helper hands back (SCM_RIGHTS over a socketpair).

The helper shares the sandbox with the program, so what comes back is
checked as the handoff checks a door: one message `m` with exactly one
descriptor, and that descriptor a pty master (a character device that
answers TIOCGPTN, which only a master does). Anything else is refused and
the run stops (the program never runs without the terminal it was promised).
"""
from __future__ import annotations

import array
import fcntl
import os
import socket
import stat

from stages.startup.records import NamedTuple  # typing's, without importing typing

_TIOCGPTN = 0x80045430
MESSAGE = b"m"


class ProgramTerminal(NamedTuple):
    """Asked of the helper: make a pty in the sandbox, send its master over
    `socket_fd`, give the program the slave as each of fds 0-2 that `stdio`
    marks (the ones on the user's terminal). A NamedTuple, not a dataclass:
    the helper imports this on its way to Ready, and dataclasses costs ~13 ms
    to import there (it loads inspect)."""
    socket_fd: int
    stdio: tuple[bool, bool, bool]


class PtyHandoffError(ValueError):
    """What came over the pty socket is not one pty master."""


def send_master(sock: socket.socket, master: int) -> None:
    socket.send_fds(sock, [MESSAGE], [master])


def receive_master(sock: socket.socket) -> int:
    """The pty master, checked; raises PtyHandoffError (closing whatever came)."""
    try:
        message, fds, _flags, _addr = socket.recv_fds(sock, 16, 4)
    except OSError as exc:
        raise PtyHandoffError(f"the pty socket failed: {exc}") from None
    problem = _problem(message, fds)
    if problem:
        for fd in fds:
            os.close(fd)
        raise PtyHandoffError(problem)
    return fds[0]


def _problem(message: bytes, fds: list[int]) -> str | None:
    if not message and not fds:
        return "the helper closed the pty socket without a terminal"
    if message != MESSAGE or len(fds) != 1:
        return f"expected one pty master, got {message[:8]!r} with {len(fds)} descriptors"
    if not stat.S_ISCHR(os.fstat(fds[0]).st_mode):
        return "the descriptor is not a character device"
    try:
        fcntl.ioctl(fds[0], _TIOCGPTN, array.array("I", [0]))
    except OSError:
        return "the descriptor is not a pty master"
    return None

"""What the helper's three processes (the seal P, init C, the program G:
seal.py's docstring draws them) share: the signals passed on, the seal's
error, the go byte, reaping, and the garbage collector's switch."""
from __future__ import annotations

import os
import signal

from stages.startup import collector
from stages.wire.exits import killed_by

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                     signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
DOCTOR_HINT = "run `vpnw doctor` to see what this machine supports"


class SealError(Exception):
    """The sandbox cannot be built; the message says what is missing."""


def read_byte(fd: int) -> bytes:
    while True:
        try:
            return os.read(fd, 1)
        except InterruptedError:
            continue
        except OSError:
            return b""


def go_byte(go_fd: int) -> bool:
    """vpnw's go (status.GO): one byte; its EOF is no go."""
    return read_byte(go_fd) != b""


def collect_from_now() -> None:
    """The garbage collector on again in a process of the helper's, off since
    its fork (main.py): until Ready the helper, init and the program only
    import and build, and a collection there found nothing to free while it
    walked (and so copied, after the fork) every object made so far. What
    exists now lives as long as the process, so it is frozen out of the
    collector's sight first (as vpnw does before its forks; stages/startup/collector.py)."""
    collector.freeze_and_resume()


def kill_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def reap(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


def decode_status(status: int) -> tuple[int, int | None]:
    if os.WIFSIGNALED(status):
        return killed_by(os.WTERMSIG(status)), os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status), None

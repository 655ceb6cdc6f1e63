"""The run's file, opened before anything runs, and vpnw's state directory.

Apart from events.py (which re-exports these names) because vpnw opens the
record before it forks the helper, and events.py imports orjson: orjson's
import (dataclasses, inspect, uuid, platform, datetime: ~10 ms) is kept off
the way to the seal (docs/architecture.md, "Start-up budget").
"""
from __future__ import annotations

import errno
import os

RUN_ID_BYTES = 6   # 48 bits: at 5,000 kept runs, a repeat is ~4e-8 (24 bits gave ~50%)


def new_run_id() -> str:
    # os.urandom, not secrets: `secrets` pulls in hmac/hashlib (~6 ms of start-up).
    return "r-" + os.urandom(RUN_ID_BYTES).hex()


def vpnw_state_dir() -> str:
    """vpnw's own state directory ($XDG_STATE_HOME/vpnw); the runs live in it."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "vpnw")


def state_dir() -> str:
    return os.path.join(vpnw_state_dir(), "runs")


class RecordUnwritable(OSError):
    """The record cannot be written; the message names the file and the fix."""


_NOT_RUN = "the program was not run"


def open_run_file(record: str | None) -> tuple[str, int, str]:
    """Open the record before anything runs: (the file's name, a writable fd,
    the run id).

    `record` is a file, "-" for stdout, or None for the state directory. Only
    the default state directory is ever created (0700); a --record FILE in a
    directory that does not exist is an error, for root too, so a typo never
    scatters records in new directories. In the state directory the file is
    new (O_EXCL): an id that is already there gets a fresh one, so no earlier
    record is ever truncated."""
    run_id = new_run_id()
    if record == "-":
        try:
            mode = os.O_ACCMODE & _fd_flags(1)
        except OSError:
            mode = None
        if mode not in (os.O_WRONLY, os.O_RDWR):
            raise RecordUnwritable(
                f"cannot write the record to stdout (--record -): stdout is closed or not "
                f"writable; fix: give vpnw a writable stdout, or --record FILE; {_NOT_RUN}")
        return record, os.dup(1), run_id
    if record is None:
        directory = state_dir()
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            return _create_new_run(directory, run_id)
        except OSError as exc:
            raise RecordUnwritable(
                f"cannot write the record in the state directory {directory}: "
                f"{exc.strerror or exc}; fix: make that directory writable, point "
                f"XDG_STATE_HOME at a writable directory, or give --record FILE; {_NOT_RUN}") from None
    parent = os.path.dirname(os.path.abspath(record))
    if not os.path.isdir(parent):
        raise RecordUnwritable(
            f"cannot write the record {record}: the directory {parent} does not exist "
            f"(vpnw creates no directory for --record); fix: create it, or give --record a "
            f"file in an existing directory; {_NOT_RUN}")
    try:
        return record, _create(record), run_id
    except OSError as exc:
        raise RecordUnwritable(
            f"cannot write the record {record}: {exc.strerror or exc}; fix: give --record a "
            f"file you can write; {_NOT_RUN}") from None


def _create_new_run(directory: str, run_id: str) -> tuple[str, int, str]:
    # O_EXCL: a repeated id (or a file planted at the name) is never truncated;
    # the run takes a fresh id instead. 48 bits make a second repeat unheard of;
    # the bound only stops a directory that refuses every name from spinning.
    for _ in range(16):
        path = os.path.join(directory, f"{run_id}.jsonl")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            run_id = new_run_id()
            continue
        return path, fd, run_id
    raise FileExistsError(errno.EEXIST, "every new run id was already taken")


def _fd_flags(fd: int) -> int:
    import fcntl    # only for `--record -` (stdout), not on every run's way to the helper's fork
    return fcntl.fcntl(fd, fcntl.F_GETFL)


def _create(path: str) -> int:
    # Private by default: the record names every host the program talked to.
    # O_NOFOLLOW: a symlink a program planted at the record's name (in a
    # directory it could write) must not make vpnw truncate what it names.
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                       0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symbolic link (vpnw never writes a record "
                                       "through one)") from None
        raise

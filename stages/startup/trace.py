"""Start-up trace: where the wall time of a run goes, process by process.

With VPNW_STARTUP_TRACE=FILE every process of a run appends one line per
mark to FILE: `<CLOCK_MONOTONIC ns> <pid> <CPU us> <stage> <what>` (CPU:
the process's user + system time so far, its own and not its children's),
one write(2) with O_APPEND, so lines of different processes never tear. The file is
opened and closed for each mark: the stages close every descriptor they do
not know (descriptors.close_all_but), and a kept one could be a number
reused by a pipe. The bench (`scripts/bench/run --only startup`) reads it
back into the start-up budget (docs/architecture.md, "Start-up budget").
Off (the variable unset or empty), `mark` does nothing: one call per mark,
no system call, no import beyond `os`.
"""
from __future__ import annotations

import os

VARIABLE = "VPNW_STARTUP_TRACE"

_path = os.environ.get(VARIABLE) or None


def _mark(stage: str, what: str) -> None:
    import time     # only when tracing (the docstring: off, no import beyond os)
    cpu = time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID) // 1000
    line = f"{time.clock_gettime_ns(time.CLOCK_MONOTONIC)} {os.getpid()} {cpu} {stage} {what}\n"
    try:
        fd = os.open(_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass     # a trace that cannot be written never changes the run


def _off(stage: str, what: str) -> None:
    return None


mark = _mark if _path else _off

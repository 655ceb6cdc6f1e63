"""Run by tests/e2e_support.py's audited_run as `python -c` (its text):
`IMPORTS_FILE [--collections-too] VPNW-ARGS...`: vpnw run as its launcher
runs it, with an audit hook in every process of the run (the hook is
inherited across fork) that appends `<CLOCK_MONOTONIC ns> <pid> <module>`
to IMPORTS_FILE for each import: what each stage had loaded by a start-up
mark. With --collections-too (taken out of sys.argv before vpnw sees it),
each garbage collection's start too, as `<ns> <pid> (gc)`; vpnw collects
once first, the control."""
import os
import sys
import time

out = sys.argv[1]
if sys.argv[2:3] == ["--collections-too"]:
    del sys.argv[2]
    import gc

    def _collection(phase, _info):
        if phase == "start":
            fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(fd, f"{time.clock_gettime_ns(time.CLOCK_MONOTONIC)} {os.getpid()} (gc)\n".encode())
            os.close(fd)
    gc.callbacks.append(_collection)
    gc.collect()


def hook(event, args):
    if event == "import":
        fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, f"{time.clock_gettime_ns(time.CLOCK_MONOTONIC)} {os.getpid()} {args[0]}\n".encode())
        os.close(fd)


sys.addaudithook(hook)
from stages.orchestrator import main  # noqa: E402 (after the hook: every import of the run is seen)

main.main(sys.argv[2:])

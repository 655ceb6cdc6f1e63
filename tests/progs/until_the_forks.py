"""Run by tests/startup_support.py (AT_THE_FORKS, until_the_forks) and
scripts/bench/tricks.py: `vpnw run --record - -- true` started as the
console script does, with os.fork replaced: at each fork `at_fork(forks)`
runs in vpnw (by default it prints the modules loaded, one line, without
json: the listing must not load what it lists), the forked child ends at
once, and the second fork (the recorder's) ends it all. A caller that runs
this source after its own may define `at_fork` first."""
import os
import sys


def _list_modules(_forks):
    print(repr(sorted(sys.modules)), flush=True)


at_fork = globals().get("at_fork", _list_modules)
real_fork, forks = os.fork, []


def fork():
    forks.append(1)
    at_fork(forks)
    if len(forks) == 2:
        os._exit(0)
    pid = real_fork()
    if pid == 0:
        os._exit(0)
    return pid


os.fork = fork
from stages.orchestrator import main  # noqa: E402  (after the fork is replaced)
main.main(["run", "--record", "-", "--", "true"])

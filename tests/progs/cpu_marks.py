"""Run by tests/test_startup_trace.py: start-up marks around burns of
argv[1] ms of CPU, in a forked child, then in the parent."""
import os
import sys
import time

from stages.startup.trace import mark

BURN_MS = int(sys.argv[1])


def burn():
    start = time.process_time()
    while time.process_time() - start < BURN_MS / 1000:
        pass


mark("vpnw", "parent")
pid = os.fork()
if pid == 0:
    burn()
    mark("helper", "child, after its burn")
    os._exit(0)
os.waitpid(pid, 0)
mark("vpnw", "parent, after the child's burn")
burn()
mark("vpnw", "parent, after its own burn")

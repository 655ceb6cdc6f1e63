"""Run by tests/test_startup_trace.py: start-up marks from a parent, its
forked child (with spaces in what it marks), then the parent again."""
import os

from stages.startup.trace import mark

mark("vpnw", "parent")
pid = os.fork()
if pid == 0:
    mark("helper", "child with spaces in what")
    os._exit(0)
os.waitpid(pid, 0)
mark("vpnw", "parent again")

"""Run by tests/test_startup_imports.py."""
# ruff: noqa: E402 (when each module loads is what the test looks at)
import json
import os
import sys
real_fork, forks = os.fork, []
def fork():      # say what is loaded at each fork; the helper's child ends at once, the recorder's stops all
    forks.append(1)
    print(json.dumps(sorted(sys.modules)), flush=True)
    if len(forks) == 2:
        os._exit(0)
    pid = real_fork()
    if pid == 0:
        os._exit(0)
    return pid
os.fork = fork
from stages.orchestrator import main
main.main(["run", "--record", "-", "--", "true"])

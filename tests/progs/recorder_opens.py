"""Run by tests/test_recorder_start_cost.py. What the recorder loads in a fork
of vpnw (the record's modules loaded, as run.py has them at the fork) to
open the key and the ledger and reserve the room of a run file: the modules
it adds, as a JSON list."""
# ruff: noqa: E402 (when each module loads is what the test looks at)
import json
import os
import sys
from stages.orchestrator import run  # noqa: F401 (loaded, as at the fork)
from stages.record import events, gate  # noqa: F401
before = set(sys.modules)
from stages.record.run_file import open_run_file
from stages.recorder import main
record, fd, _ = open_run_file(sys.argv[1])
run_file = main._RunFile(fd, record)
sealer = main._open_sealer(run_file)
assert sealer not in (None, False)
r, w = os.pipe()
assert main._reserve_room(run_file, record, r, None) is not None
print(json.dumps(sorted(set(sys.modules) - before)))

"""Run by tests/test_e2e_terminal.py. Runs a command in the same process group
as itself (the terminal's foreground group, as vpnw would be) and counts the
SIGWINCH and SIGTTOU... that reach it while the command runs."""
import collections
import json
import signal
import subprocess
import sys
seen = collections.Counter()
for sig in (signal.SIGWINCH, signal.SIGCONT, signal.SIGUSR1):
    signal.signal(sig, lambda s, _f: seen.update([signal.Signals(s).name]))
code = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "seen": dict(seen)}, f)

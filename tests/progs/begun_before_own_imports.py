"""Run by tests/test_broker_early.py. In a fresh interpreter, as in a forked
broker that has loaded neither socket nor the link's messages: the doors
come from the parent (the helper)."""
import sys
from stages.broker import startup
seen = []
startup.mark = lambda stage, what: seen.append((what, "socket" in sys.modules,
                                                "stages.wire.handoff" in sys.modules))
startup.load_while_watching(int(sys.argv[1]), lambda: None)
print(seen[0])

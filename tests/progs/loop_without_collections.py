"""Run by tests/test_broker_early.py. In a fresh interpreter, as in a forked
broker: the collector on (fork_stage turns it on in each stage) or off, then
the loop's import."""
import gc
import sys
from stages.broker.main import _load_the_loop
gc.enable() if sys.argv[1] == "on" else gc.disable()
during = []
gc.callbacks.append(lambda phase, info: phase == "start" and during.append(info["generation"]))
frozen_before = gc.get_freeze_count()
_load_the_loop(capture=False)
print("collections during the import:", len(during))
print("collector on afterwards:", gc.isenabled())
print("frozen by the import:", gc.get_freeze_count() > frozen_before)

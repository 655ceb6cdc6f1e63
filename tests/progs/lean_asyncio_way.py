"""Run by tests/test_lean_asyncio.py: vpnw's own modules at the broker's fork
(what the broker inherits), then asyncio imported one way, then the checks.
argv: the way ("plain", "brokers" or "brokers-capture"), the checks' module
(beside this file), the stood-in modules (comma-separated). The checks
import `loaded` (what the way loaded) and OFF_THE_LOOP from here."""
import sys

for name in ("stages.orchestrator.main", "stages.orchestrator.run_command", "stages.record.events",
             "stages.wire.status"):
    __import__(name)
way, checks, OFF_THE_LOOP = sys.argv[1], sys.argv[2], set(sys.argv[3].split(","))
before = set(sys.modules)
if way != "plain":
    from stages.broker.main import _load_the_loop
    _load_the_loop(capture=way == "brokers-capture")
__import__("asyncio")
loaded = sorted(set(sys.modules) - before)
__import__(checks)

"""Run by tests/test_startup_budget.py: the broker's loop as _load_the_loop
loads it on the direct path, then the modules loaded (one line, no json)."""
import sys

from stages.startup.lean_asyncio import import_asyncio

import_asyncio(without_ssl=True)
from stages.broker import decide, loop  # noqa: E402,F401  (what they load is the point)
print(repr(sorted(sys.modules)))

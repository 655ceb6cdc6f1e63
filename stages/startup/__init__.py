"""Start-up tricks: everything vpnw does to start faster than plain Python
would, in one place (docs/architecture.md, "Start-up budget"; the table of
them, each with what it buys: stages/startup/tricks.py).

`VPNW_STARTUP_TRICKS=off` in the environment turns every trick off: vpnw then
imports as any Python program does, and behaves the same. Every process of
a run reads it from the environment it inherits (the helper, the recorder,
the broker and its workers are forked; the WireGuard path process is
exec'd with vpnw's own environment; `vpnw learn` is a vpnw of its own);
the program's environment is the person's, as before. A trick done by a
call asks `startup.ON` when it runs; one made at import (the records,
json_c, digests) when its module loads, so a measurement
(scripts/bench/tricks.py) can turn it off within one process before that."""
from __future__ import annotations

import os

VARIABLE = "VPNW_STARTUP_TRICKS"

ON = os.environ.get(VARIABLE, "on") != "off"

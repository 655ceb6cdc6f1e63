"""Start-up tricks: everything vpnw does to start faster than plain Python
would, in one place (docs/architecture.md, "Start-up budget").

`VPNW_STARTUP_TRICKS=off` in the environment turns every trick off: vpnw then
imports as any Python program does, and behaves the same."""
from __future__ import annotations

import os

ON = os.environ.get("VPNW_STARTUP_TRICKS", "on") != "off"

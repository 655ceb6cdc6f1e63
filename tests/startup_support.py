"""For the tests that check a start-up trick is in place (stages/startup/):
with the tricks off (VPNW_STARTUP_TRICKS=off, stages/startup/__init__.py)
there is nothing for them to check, and they skip, saying so."""
from __future__ import annotations

import pytest

from stages import startup

needs_the_tricks = pytest.mark.skipif(
    not startup.ON, reason="VPNW_STARTUP_TRICKS=off: checks a start-up trick that is off")

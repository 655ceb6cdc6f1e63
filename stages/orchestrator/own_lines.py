"""vpnw's own lines during a run ("vpnw: MESSAGE"), one object per run that
the run's parts are handed: on stderr, or, while the program's terminal is
relayed, joined to the program's output at line boundaries
(terminal.TerminalRelay.say) instead of cutting into it."""
from __future__ import annotations

import sys


class OwnLines:
    """say(message): one of vpnw's lines, where it belongs now."""

    def __init__(self):
        self.relay_say = None        # the relay's say while it runs, else None (stderr)

    def __call__(self, message: str) -> None:
        if self.relay_say is not None:
            self.relay_say(f"vpnw: {message}")
            return
        sys.stderr.write(f"vpnw: {message}\n")
        sys.stderr.flush()

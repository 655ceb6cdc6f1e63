"""The broker's warning line: one place, so every warning reads alike."""
from __future__ import annotations

import os


def warn(message: str) -> None:
    """A warning line on the broker's fd 2 (vpnw's human lines)."""
    try:
        os.write(2, f"vpnw broker: warning: {message}\n".encode("utf-8", "replace"))
    except OSError:
        pass

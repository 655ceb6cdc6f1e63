"""The WireGuard path's dialer (being built): until the path namespace lands,
a wireguard path is refused before the program starts (exit 123), never
dialled directly."""
from __future__ import annotations

from .dial import DialError, PathDown


class WireGuardDialer:
    kind = "wireguard"
    resolves_at_exit = False

    def __init__(self, path):
        self.path = path

    async def check(self) -> None:
        raise PathDown(f"{self.path.describe()}: this build of vpnw cannot open WireGuard tunnels yet")

    async def dial(self, host, port, addresses):
        raise DialError("path-down", "the WireGuard path is not open")

"""The Dialer for a path: the one place that knows every kind of path, so
the dial contract (dial.py) imports none of them."""
from __future__ import annotations

from stages.broker.dial import Dialer, DirectDialer


def dialer_for(path) -> Dialer:
    """The Dialer for a paths.PathSpec."""
    if path.type == "direct":
        return DirectDialer()
    if path.type == "wireguard":
        # Each kind's dialer only on its own path: a direct run loads neither.
        from stages.broker.wireguard.dialer import WireGuardDialer
        return WireGuardDialer(path)
    from stages.broker.upstream import ProxyDialer      # (as above)
    return ProxyDialer(path)

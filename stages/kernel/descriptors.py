"""Closing inherited descriptors in a freshly forked child.

A child that keeps a copy of a descriptor it does not use can keep its peer
from ever seeing the end (a socket, a pipe's write end), so every forked
process of vpnw keeps only what it is given.
"""
from __future__ import annotations

import os


def close_all_but(keep) -> None:
    """Close every descriptor from 3 up except those in `keep` (close_range:
    one system call a gap)."""
    low = 3
    for fd in sorted(set(keep)):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, 0x7FFFFFFF)

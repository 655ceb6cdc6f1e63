"""What the broker's sans-I/O parsers (socks5.py, http_proxy.py) share.

A parser takes bytes with `feed()` and hands out events with `next_event()`;
besides event objects it answers with named sentinels, compared by identity
(as h11 does): NEED_DATA when it cannot go on without more bytes. The HTTP
framing's states are sentinels of the same kind.
"""
from __future__ import annotations


class Sentinel:
    """A named, unique marker: an event without data, or a parser's state."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = Sentinel("NEED_DATA")   # feed more bytes (or feed_eof) before asking again

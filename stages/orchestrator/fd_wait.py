"""vpnw's wait on its stages' fds without the selectors module: the part of
selectors.EpollSelector that run.py's wait uses (register, unregister,
select, close; keys with .fd and .data), on select.epoll directly.

A run with a terminal relay or `guard --ask` waits with selectors itself
(the relay and the asker are written for it, and their sockets load it
through the socket module anyway). A plain run's vpnw makes its sockets with
_socket and loads nothing else that needs selectors, whose import (its
classes, the SelectorKey namedtuple, collections.abc) was about 1 ms of
vpnw's CPU between the broker's fork and go (docs/architecture.md,
"Start-up budget").
"""
from __future__ import annotations

import math
import select

EVENT_READ = 1       # selectors.EVENT_READ


class Key:
    """A registered fd and what run.py attached to it (selectors.SelectorKey's .fd, .data)."""

    __slots__ = ("fd", "data")

    def __init__(self, fd: int, data):
        self.fd, self.data = fd, data


class ReadWait:
    """Waits for any of its fds to be readable (or hung up, or in error:
    selectors reports those as readable too)."""

    def __init__(self):
        self._epoll = select.epoll()
        self._keys: dict[int, Key] = {}

    def register(self, fd: int, events: int, data=None) -> Key:
        if events != EVENT_READ:
            raise ValueError(f"only EVENT_READ is waited for here, not {events!r}")
        if fd in self._keys:
            raise KeyError(f"{fd} is already registered")
        self._epoll.register(fd, select.EPOLLIN)
        key = self._keys[fd] = Key(fd, data)
        return key

    def unregister(self, fd: int) -> Key:
        key = self._keys.pop(fd)
        try:
            self._epoll.unregister(fd)
        except OSError:      # closed meanwhile: the kernel has dropped it, as selectors allows
            pass
        return key

    def select(self, timeout: float | None = None) -> list[tuple[Key, int]]:
        """[(key, EVENT_READ)] for each fd that is ready; [] once the timeout
        passes. The timeout is rounded up to the millisecond, as selectors
        does, so a wait never ends before it."""
        if timeout is None:
            timeout = -1
        elif timeout <= 0:
            timeout = 0
        else:
            timeout = math.ceil(timeout * 1e3) * 1e-3
        ready = self._epoll.poll(timeout, max(len(self._keys), 1))
        return [(self._keys[fd], EVENT_READ) for fd, _ in ready if fd in self._keys]

    def close(self) -> None:
        self._epoll.close()
        self._keys.clear()


DefaultSelector = ReadWait      # run.py names it as it names selectors'

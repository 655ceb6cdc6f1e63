"""The broker's first moments on the direct path: its loop loads while the
link is watched.

Importing the loop (asyncio and what it pulls in) takes the broker some
40 ms, longer than the helper takes to seal the sandbox and a short program
takes to run. Waiting for that import only to learn that the helper has
gone made every short run (`vpnw run -- true`) end when the broker's loop
was ready, not when the program was. So the import runs in a thread while
this process's main thread reads the link: the doors the helper hands over,
then either

- a connection waiting at a door (or handed over): the loop is needed; wait
  for the import and serve it, as always;
- the import done: serve, as always;
- the link's end (the helper is gone) with no connection waiting at any
  door: nothing can ever be asked of this broker, so it ends at once with
  zero connections, without its loop.

A door's backlog is looked at after the link's end (a connection the program
made just before it exited waits there, complete): such a run takes the
loop, and that connection reaches the record.
"""
from __future__ import annotations

import os
import select
import socket
import threading
from dataclasses import dataclass, field

from stages.wire.handoff import Handed, take_pending


@dataclass
class Early:
    """What the link said before the loop was there."""
    handed: list[Handed] = field(default_factory=list)   # in the order they came
    link_over: bool = False     # the helper's end of the link closed
    quiet_end: bool = False     # link over, no connection anywhere: no loop needed
    warnings: list[str] = field(default_factory=list)


def load_while_watching(link_fd: int, load) -> Early:
    """Run load() (the loop's imports) in a thread; meanwhile read the link
    (fd `link_fd`, left open and non-blocking). Returns once the loop is
    loaded, is needed, or never will be (Early.quiet_end)."""
    loaded_r, loaded_w = os.pipe2(os.O_CLOEXEC)

    def loader() -> None:
        try:
            load()
        except BaseException:   # noqa: BLE001 - the main thread imports again and sees it
            pass
        finally:
            os.write(loaded_w, b"l")

    thread = threading.Thread(target=loader, name="vpnw-broker-load", daemon=True)
    thread.start()
    link = socket.socket(fileno=link_fd)
    link.setblocking(False)
    early = Early()
    try:
        _watch(link, loaded_r, early)
    finally:
        link.detach()
    if not early.quiet_end:
        # Loaded, or needed: either way the import finishes first. (On a
        # quiet end the thread may still be importing: the process ends
        # without it, and the pipe stays open for it until then.)
        thread.join()
        os.close(loaded_r)
        os.close(loaded_w)
    return early


def _watch(link: socket.socket, loaded_r: int, early: Early) -> None:
    """Read the link until the loop has loaded, is needed (a connection),
    or never will be (early.quiet_end)."""
    while True:
        ready = _readable({loaded_r, *_doors(early), link.fileno()})
        if loaded_r in ready or ready & _doors(early):
            return                  # loaded, or a connection at a door
        pending = take_pending(link)
        early.handed += pending.handed
        early.warnings += pending.problems
        if any(h.kind == "conn" for h in pending.handed):
            return                  # a connection handed over
        if pending.ended:
            early.link_over = True
            early.quiet_end = not _readable(_doors(early), timeout_ms=0)
            return


def _doors(early: Early) -> set[int]:
    return {h.sock.fileno() for h in early.handed if h.kind in ("door", "datagram")}


def _readable(fds: set[int], timeout_ms: int | None = None) -> set[int]:
    # poll, not select: no limit on the descriptors' numbers.
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(timeout_ms)}

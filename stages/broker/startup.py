"""The broker's first moments on the direct path: its loop loads while the
link is watched.

Importing the loop (asyncio and what it pulls in) takes the broker some
40 ms, longer than the helper takes to seal the sandbox and a short program
takes to run. Waiting for that import only to learn that the helper has
gone made every short run (`vpnw run -- true`) end when the broker's loop
was ready, not when the program was. So the import runs in a thread while
this process's main thread reads the link: the doors the helper hands over,
then what the program does.

The import begins when the first doors come over the link (the helper hands
them over once the sandbox is sealed, just before it reports ready), and
before this thread's own imports (socket, the link's messages), which it
would otherwise wait behind. No connection can come before a door exists,
so none waits for an import that had not begun; the program's first
connection waits at most for what is left of it.

Begun earlier, as soon as PathOk is out, the import finishes sooner for a
program that connects at once, but its CPU then competes with the last
steps before go (init's binds, the program's seal, the recorder's run.start:
both cores are busy until just before go), and a run that never connects
pays it too (docs/architecture.md, "Start-up budget", the figures).

The ways out:

- a connection waiting at a door (or handed over): the loop is needed; wait
  for the import and serve it, as always;
- the import done: serve, as always;
- the link's end (the helper is gone) with no connection waiting at any
  door: nothing can ever be asked of this broker, so it ends at once with
  zero connections, without its loop.

A door's backlog is looked at after the link's end (a connection the program
made just before it exited waits there, complete): such a run takes the
loop, and that connection reaches the record.

On that quiet end the import, if still going, is halted: it raises at its
next module (`_Loader.find_spec`) and its thread ends. Left to go on, it
held the GIL and a core while this thread wrote the totals and the rest of
the run ended: the end of a `vpnw run -- true` (the helper's last report to
vpnw's Totals) took several times as long as with the loop up.
"""
from __future__ import annotations

import os
import select
import sys
import threading
from stages.startup.trace import mark


class Early:
    """What the link said before the loop was there. (A plain class: no
    dataclass made before the import begins.)"""

    def __init__(self):
        self.handed: list = []          # in the order they came
        self.link_over = False          # the helper's end of the link closed
        self.quiet_end = False          # link over, no connection anywhere: no loop needed
        self.warnings: list[str] = []


IMPORTING_SWITCH_INTERVAL = 0.0005     # s


class _Halted(BaseException):
    """Raised in the import thread at its next module once halted: a
    BaseException, so no `except ImportError` on the way swallows it."""


class _Loader:
    """load() in a thread of its own, begun on the first doors (see above).
    While it runs it is also the first finder on sys.meta_path, which
    halts that thread's import once asked (halt())."""

    def __init__(self, load):
        self.load = load
        self.loaded_r, self.loaded_w = os.pipe2(os.O_CLOEXEC)
        self.thread: threading.Thread | None = None
        self.interval = sys.getswitchinterval()
        self.halted = False

    def start(self) -> None:
        if self.thread is not None:
            return
        mark("broker", "loop import begun")
        # The import holds the GIL; the main thread, woken by the link's end
        # (the program is over: a short run ends now), would wait up to the
        # switch interval (5 ms) for it, each time. Short while importing.
        sys.setswitchinterval(IMPORTING_SWITCH_INTERVAL)
        self.thread = threading.Thread(target=self._run, name="vpnw-broker-load", daemon=True)
        sys.meta_path.insert(0, self)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.load()
            mark("broker", "loop loaded")
        except BaseException:   # noqa: BLE001 - the main thread imports again and sees it
            pass
        finally:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            if self.halted:     # nobody waits for it (finish() restores it otherwise)
                sys.setswitchinterval(self.interval)
            os.write(self.loaded_w, b"l")

    def halt(self) -> None:
        """The loop will never be needed (a quiet end): the import stops at
        its next module instead of competing with the end for the GIL and
        a core. Only for a process that then ends without the loop."""
        self.halted = True

    def find_spec(self, name, path=None, target=None):
        """A finder that finds nothing (the next finders do), but raises
        _Halted in the import thread once halted."""
        if self.halted and threading.current_thread() is self.thread:
            raise _Halted(name)
        return None

    def finish(self) -> None:
        """Wait for the import (begun now if it was not) and close the pipe."""
        self.start()
        self.thread.join()
        sys.setswitchinterval(self.interval)
        os.close(self.loaded_r)
        os.close(self.loaded_w)


def load_while_watching(link_fd: int, load) -> Early:
    """Run load() (the loop's imports) in a thread once the first doors have
    come; meanwhile read the link (fd `link_fd`, left open and
    non-blocking). Returns once the loop is loaded, is needed, or never will
    be (Early.quiet_end)."""
    loader = _Loader(load)
    if _doors_come(link_fd):
        loader.start()
    # Only now, after the import has begun (which loads socket too, first):
    import socket
    link = socket.socket(fileno=link_fd)
    link.setblocking(False)
    early = Early()
    try:
        _watch(link, loader, early)
    finally:
        link.detach()
    if not early.quiet_end:
        # Loaded, or needed: either way the import finishes first. (On a
        # quiet end the thread was halted, or never began: the process ends
        # without it, and the pipe stays open for it until then.)
        loader.finish()
    return early


def _watch(link, loader: _Loader, early: Early) -> None:
    """Read the link until the loop has loaded, is needed (a connection),
    or never will be (early.quiet_end)."""
    # socket and the link's messages, once the loop's import has begun (the docstring above)
    from stages.wire.handoff import take_pending
    while True:
        ready = _readable({loader.loaded_r, *_doors(early), link.fileno()})
        if loader.loaded_r in ready or ready & _doors(early):
            return                  # loaded, or a connection at a door
        pending = take_pending(link)
        early.handed += pending.handed
        early.warnings += pending.problems
        if any(h.kind == "conn" for h in pending.handed):
            return                  # a connection handed over
        if pending.ended:
            early.link_over = True
            early.quiet_end = not _readable(_doors(early), timeout_ms=0)
            if early.quiet_end:
                loader.halt()
            return


def _doors_come(link_fd: int) -> bool:
    """Wait for the link's first message: True when something came over a
    link still open (the doors), False on its end alone (a helper gone
    before the seal hands no door, and its broker needs no loop)."""
    poller = select.poll()
    poller.register(link_fd, select.POLLIN)
    [(_fd, events)] = poller.poll()
    return not events & (select.POLLHUP | select.POLLERR)


def _doors(early: Early) -> set[int]:
    return {h.sock.fileno() for h in early.handed if h.kind in ("door", "datagram")}


def _readable(fds: set[int], timeout_ms: int | None = None) -> set[int]:
    # poll, not select: no limit on the descriptors' numbers.
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(timeout_ms)}

"""CPython's C halves, imported directly where the public module's import
costs a stage's start more than the job needs (start-up tricks,
stages/startup/tricks.py). With the tricks off (`startup.ON` false), each
function here uses the public module, as any Python program would.

- the record's digests: c_digests.py.
- `seqpacket_pair()`: a SOCK_SEQPACKET Unix socket pair as two fds, made
  with `_socket`: the socket module (whose import loads selectors) is then
  imported after vpnw forks the helper, on both sides at once.
- `in_a_thread(job)`: `job` run in a thread of its own, with `_thread`
  (threading's import is ~2.6 ms of the recorder's start, and nothing else
  there needs it); returns the wait for its end.
"""
from __future__ import annotations

from stages import startup


def seqpacket_pair() -> tuple[int, int]:
    if startup.ON:
        import _socket as sockets    # the C half alone: the trick (above)
    else:
        import socket as sockets     # the tricks off: the public module
    ours, theirs = sockets.socketpair(sockets.AF_UNIX, sockets.SOCK_SEQPACKET)
    return ours.detach(), theirs.detach()


def in_a_thread(job):
    """Run job() in a thread; the returned function waits for its end. No
    thread to be had (RuntimeError): job() runs here, first."""
    if startup.ON:
        import _thread as threads       # the trick (above)
        done = threads.allocate_lock()
    else:
        import threading as threads     # the tricks off: the public module
        done = threads.Lock()
    done.acquire()

    def run_then_release():
        try:
            job()
        finally:
            done.release()
    try:
        if startup.ON:
            threads.start_new_thread(run_then_release, ())
        else:
            threads.Thread(target=run_then_release, daemon=True).start()
    except RuntimeError:        # no thread to be had: here, first
        run_then_release()
    return lambda: done.acquire()

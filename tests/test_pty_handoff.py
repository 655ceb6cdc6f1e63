"""The pty master the helper hands the orchestrator (stages/wire/pty_handoff.py):
a real master passes; anything else the sandbox could send is refused, and
what came with it is closed."""
from __future__ import annotations

import os
import pty
import socket

import pytest

from stages.wire.pty_handoff import PtyHandoffError, receive_master, send_master


def _pair():
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def test_a_pty_master_passes():
    master, slave = pty.openpty()
    ours, theirs = _pair()
    with ours, theirs:
        send_master(theirs, master)
        got = receive_master(ours)
    assert os.ttyname(slave)
    os.write(got, b"x\n")
    assert os.read(slave, 16).startswith(b"x")
    for fd in (got, master, slave):
        os.close(fd)


@pytest.mark.parametrize("what", ["slave", "file", "socket", "two", "none", "wrong-tag", "closed"])
def test_anything_else_is_refused_and_closed(what, tmp_path):
    master, slave = pty.openpty()
    other = os.open(tmp_path / "f", os.O_CREAT | os.O_RDWR)
    a, b = socket.socketpair()
    ours, theirs = _pair()
    sent = {"slave": ([b"m"], [slave]), "file": ([b"m"], [other]), "socket": ([b"m"], [a.fileno()]),
            "two": ([b"m"], [master, master]), "none": ([b"m"], []),
            "wrong-tag": ([b"x"], [master])}.get(what)
    before = set(os.listdir("/proc/self/fd"))
    if sent is None:
        theirs.close()
    else:
        socket.send_fds(theirs, *sent)
    with pytest.raises(PtyHandoffError):
        receive_master(ours)
    # Nothing that came over the socket is left open here.
    assert set(os.listdir("/proc/self/fd")) <= before
    for s in (ours, theirs, a, b):
        s.close()
    for fd in (master, slave, other):
        os.close(fd)

"""The seccomp filter as bytes (stages/helper/seccomp_rules.py filter_bpf,
load_bpf): the helper makes libseccomp's BPF once while it seals, and the
program's process loads those bytes with seccomp(2) (libseccomp's own load
made the BPF again there, after go). Here: what is not a program is refused,
and a process that loaded the bytes is refused what the rules refuse, while
the same calls in this (unfiltered) process succeed: the control."""
from __future__ import annotations

import errno
import os
import socket

import pytest

from stages.helper.seccomp_rules import filter_bpf, load_bpf

AF_PACKET = 17


def test_load_refuses_what_is_not_a_program():
    with pytest.raises(ValueError):
        load_bpf(b"")


def _errno_of(family: int, kind: int = socket.SOCK_STREAM) -> int:
    try:
        socket.socket(family, kind).close()
        return 0
    except OSError as e:
        return e.errno


def test_a_process_that_loaded_the_bytes_is_refused_what_the_rules_refuse():
    tries = [(socket.AF_INET, socket.SOCK_STREAM), (socket.AF_UNIX, socket.SOCK_STREAM),
             (AF_PACKET, socket.SOCK_DGRAM)]
    bpf = filter_bpf(False)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            load_bpf(bpf)
            os.write(w, ",".join(str(_errno_of(f, k)) for f, k in tries).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 100).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert got == f"0,{errno.EAFNOSUPPORT},{errno.EAFNOSUPPORT}"
    # The control: unfiltered, AF_UNIX is made (AF_PACKET may need privileges).
    assert _errno_of(socket.AF_UNIX) == 0
    assert _errno_of(AF_PACKET, socket.SOCK_DGRAM) in (0, errno.EPERM)

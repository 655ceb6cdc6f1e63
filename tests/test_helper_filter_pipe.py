"""The seccomp filter as bytes (stages/helper/seccomp_rules.py filter_bpf,
load_bpf): the helper builds it once init is forked and writes it to init
(stages/helper/sandbox.py take_filter); init lets the program run only with a
whole BPF program in hand. Here: the pipe's end cases, and a process that
loads the bytes is refused what the rules refuse, while the same calls in
this (unfiltered) process succeed: the control."""
from __future__ import annotations

import errno
import os
import socket

import pytest

from stages.helper.sandbox import take_filter
from stages.helper.seccomp_rules import filter_bpf, load_bpf

AF_PACKET = 17


def _piped(data: bytes) -> int:
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    return r


def test_init_takes_a_whole_program():
    bpf = filter_bpf(False)
    assert take_filter(_piped(bpf)) == bpf


@pytest.mark.parametrize("data", [b"", b"\0" * 12], ids=["nothing", "torn"])
def test_init_takes_no_filter_from_an_empty_or_torn_pipe(data):
    assert take_filter(_piped(data)) is None


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

"""The race a check-then-continue supervisor loses (tests/test_supervisor_race.py).

    unix_race.py DIR TRIES [--until-beaten]

Listens on DIR/a.sock itself (a socket made and listened on under the
supervisor: recorded as the program's own), then connects TRIES times to a
sockaddr_un in its memory that names DIR/a.sock, while another thread keeps
rewriting the one byte that makes it name DIR/b.sock (a socket bound outside,
which no supervisor may let it reach) and back. Every other connect is made
on a non-blocking socket (the compiled path's kind), the rest on blocking
ones (the Python path's). Each connect that succeeds asks getpeername() which
socket it reached. Prints one JSON line: how many reached a.sock and b.sock,
how many were refused (EPERM), any other errno by name, and the tries made;
with --until-beaten it stops at the first that reached b.sock.
Standard library only: it runs under the program's seccomp filter.
"""
import ctypes
import errno
import json
import os
import socket
import sys
import threading

libc = ctypes.CDLL(None, use_errno=True)
libc.connect.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_uint)
libc.connect.restype = ctypes.c_int


def main(directory: str, tries: int, until_beaten: bool) -> dict:
    allowed = os.path.join(directory, "a.sock").encode()
    own = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    own.bind(allowed)
    own.listen(128)
    own.setblocking(False)
    raw = socket.AF_UNIX.to_bytes(2, "little") + allowed + b"\0"
    address = ctypes.create_string_buffer(raw, len(raw))
    at = ctypes.addressof(address) + 2 + len(allowed) - len(b"a.sock")    # the "a"
    stop = threading.Event()

    def rewrite():
        while not stop.is_set():
            for _ in range(64):
                ctypes.memset(at, ord("b"), 1)
                ctypes.memset(at, ord("a"), 1)

    flipper = threading.Thread(target=rewrite, daemon=True)
    flipper.start()
    counts = {"a": 0, "b": 0, "refused": 0, "other": {}, "tries": 0}
    try:
        for attempt in range(tries):
            counts["tries"] = attempt + 1
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.setblocking(attempt % 2 == 0)
                if libc.connect(client.fileno(), address, len(raw)) == 0:
                    peer = client.getpeername()
                    peer = peer.encode() if isinstance(peer, str) else peer
                    counts["a" if peer == allowed else "b"] += 1
                else:
                    name = errno.errorcode.get(ctypes.get_errno(), "?")
                    if name == "EPERM":
                        counts["refused"] += 1
                    else:
                        counts["other"][name] = counts["other"].get(name, 0) + 1
            _drain(own)
            if until_beaten and counts["b"]:
                break
    finally:
        stop.set()
        flipper.join()
    return counts


def _drain(listener: socket.socket) -> None:
    """Take what waits in the backlog, so a blocking connect never waits on it."""
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.close()


if __name__ == "__main__":
    sys.setswitchinterval(0.0001)      # the connecting thread gets the GIL back at once
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), "--until-beaten" in sys.argv[3:])), flush=True)

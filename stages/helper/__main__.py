"""Run one program in the sandbox alone, with no broker:

    python -m stages.helper [--allow-unix-sockets] [--status-fd N] -- PROG ARGS

Connections to the doors (handed over as the broker gets them: the doors'
listening sockets) are reported on stderr (`vpnw-helper: conn http`),
answered with b"bye" and closed. Exits with the program's status (122 when the sandbox cannot be
built). Status lines go to stderr, or to --status-fd.
"""
from __future__ import annotations

import os
import selectors
import sys

from stages.wire import handoff
from stages.helper.main import run_helper
from stages.wire import status as st
from stages.wire.exits import ExitCode


def _greet(conn) -> None:
    """Read what the client sent first (a few bytes) and answer b"bye", so a
    test can see the handed-over descriptor really carries its connection."""
    conn.settimeout(2)
    try:
        conn.recv(64)
        conn.sendall(b"bye")
        conn.shutdown(2)
    except OSError:
        pass
    finally:
        conn.close()


def _greet_handed(door: str, conn) -> None:
    print(f"vpnw-helper: conn {door}", file=sys.stderr, flush=True)
    _greet(conn)


def main(args: list[str]) -> int:
    allow_unix, status_out = False, None
    while args and args[0] != "--":
        opt = args.pop(0)
        if opt == "--allow-unix-sockets":
            allow_unix = True
        elif opt == "--status-fd" and args:
            status_out = int(args.pop(0))
        else:
            print(f"usage: python -m stages.helper [--allow-unix-sockets] "
                  f"[--status-fd N] -- PROG ARGS (unknown {opt!r})", file=sys.stderr)
            return 2
    argv = args[1:]
    helper_end, broker_end = handoff.link()
    status_r, status_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        broker_end.close()
        os.close(status_r)
        os.close(go_w)
        run_helper(argv, handoff_fd=helper_end.fileno(), status_fd=status_w, go_fd=go_r,
                   allow_unix_sockets=allow_unix)
    helper_end.close()
    os.close(status_w)
    os.close(go_r)
    status = os.fdopen(status_r, "rb")
    result = ExitCode.INTERNAL
    sel = selectors.DefaultSelector()
    sel.register(status, selectors.EVENT_READ, "status")
    sel.register(broker_end, selectors.EVENT_READ, "link")
    open_ = {"status", "link"}
    while "status" in open_:
        for key, _ in sel.select():
            if key.data == "link":
                try:
                    handed = handoff.receive(broker_end)
                except handoff.HandoffError as e:
                    print(f"vpnw-helper: bad handoff: {e}", file=sys.stderr)
                    continue
                if handed is None:
                    sel.unregister(broker_end)
                    open_.discard("link")
                elif handed.kind == "door":
                    handed.sock.setblocking(False)
                    sel.register(handed.sock, selectors.EVENT_READ, ("door", handed.door))
                else:
                    _greet_handed(handed.door, handed.sock)
                continue
            if key.data != "status":
                try:
                    conn, _ = key.fileobj.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                _greet_handed(key.data[1], conn)
                continue
            line = status.readline()
            if not line:
                sel.unregister(status)
                open_.discard("status")
                break
            if status_out is not None:
                os.write(status_out, line)
            else:
                sys.stderr.write("vpnw-helper: " + line.decode())
                sys.stderr.flush()
            msg = st.decode(line.rstrip(b"\n"), st.HELPER_STATUS)
            if isinstance(msg, st.Ready):
                os.write(go_w, st.GO)
            elif not isinstance(msg, st.UnixConnect):    # shown above; the run goes on
                result = msg.code
    os.close(go_w)
    os.waitpid(pid, 0)
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

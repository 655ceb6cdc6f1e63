"""Run by tests/test_e2e_unix.py."""
import select
import socket
import sys
own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen()
for port in [int(p) for p in sys.argv[1:]] or [own.getsockname()[1]]:
    s = socket.socket()
    s.setblocking(False)           # as curl's: EINPROGRESS, the case that looked
    started = s.connect_ex(("127.0.0.1", port))
    select.select([], [s], [], 10)
    error = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    print(port, started, error)
    s.close()
    if error:
        sys.exit(1)            # audited_run wants exit 0: each connect was made

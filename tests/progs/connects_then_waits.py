"""Run by tests/test_e2e_unix.py. TCP connects of a program of one thread, then
of four (non-blocking, as Node, Go and tokio make them), each to a listener
of its own; then it waits for a line, so the test can look at the run's
supervisor meanwhile."""
import select
import socket
import sys
import threading
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(64)
def connect(blocking):
    with socket.socket() as s:
        s.setblocking(blocking)
        s.connect_ex(server.getsockname())
        select.select([], [s], [], 10)
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        server.accept()[0].close()
for _ in range(5):
    connect(True)
parked = threading.Event()
for _ in range(3):
    threading.Thread(target=parked.wait, daemon=True).start()
for _ in range(5):
    connect(False)
print("connected", flush=True)
sys.stdin.readline()

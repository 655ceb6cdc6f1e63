"""Run by tests/test_e2e_record.py's start_microsocks: exit 0 as soon as
127.0.0.1:argv[1] accepts a connection, 1 if it has not within ~10 s."""
import socket
import sys
import time

port = int(sys.argv[1])
for _ in range(400):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.025)
sys.exit(1)

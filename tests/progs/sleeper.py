"""Run by tests/test_e2e_signals.py."""
import socket
import sys
import time
marker = sys.argv[1]
conn = socket.create_connection(("127.0.0.1", 3128))
conn.sendall(b"CONNECT api.github.com:80 HTTP/1.1\r\nHost: api.github.com:80\r\n\r\n")
assert conn.recv(4096).startswith(b"HTTP/1.1 200")
print("ready", flush=True)
with open(marker, "a") as beat:
    for _ in range(2400):       # a heartbeat while it lives (about 2 minutes)
        beat.write("alive\n")
        beat.flush()
        time.sleep(0.05)

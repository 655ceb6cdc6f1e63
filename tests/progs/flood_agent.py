"""Run by tests/test_e2e_load.py."""
import socket
import sys
AT_ONCE, AFTER = int(sys.argv[1]), int(sys.argv[2])
name = b"api.github.com"
REQUEST = (b"\x05\x01\x00" + b"\x05\x01\x00\x03" + bytes([len(name)]) + name + (80).to_bytes(2, "big")
           + b"GET / HTTP/1.0\r\nHost: api.github.com\r\n\r\n")

def finish(s):
    s.sendall(REQUEST)      # greeting, request and GET at once: the door reads them in turn
    while s.recv(65536):
        pass
    s.close()

# AT_ONCE connections opened together (the door's backlog fills at once),
# then served; then AFTER more, one after another.
held = [socket.create_connection(("127.0.0.1", 1080), timeout=30) for _ in range(AT_ONCE)]
for s in held:
    finish(s)
for _ in range(AFTER):
    finish(socket.create_connection(("127.0.0.1", 1080), timeout=30))

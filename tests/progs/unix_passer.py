"""Run by tests/bypass/test_unix_origin.py. ── a socket made outside, passed in
by a socket the policy names ────────"""
import os
import socket
import sys
path = sys.argv[1]
family = socket.AF_INET if sys.argv[2:] == ["inet"] else socket.AF_UNIX
server = socket.socket(socket.AF_UNIX)
server.bind(path)
os.chmod(path, 0o777)
server.listen(16)
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    made_outside = socket.socket(family, socket.SOCK_STREAM)
    socket.send_fds(conn, [b"s"], [made_outside.fileno()])
    made_outside.close()
    conn.close()


import os
import socket
import sys
token = sys.argv[1]
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork():
        os._exit(0)
    os.close(r)
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conn.connect(("127.0.0.1", 1080))
    conn.sendall(b"\x05\x01\x00")
    assert conn.recv(2) == b"\x05\x00"
    host = b"api.github.com"
    conn.sendall(b"\x05\x01\x00\x03" + bytes([len(host)]) + host + (80).to_bytes(2, "big"))
    reply = conn.recv(10)
    assert reply[:2] == b"\x05\x00", reply
    os.set_inheritable(conn.fileno(), True)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.write(w, b"up")
    os.close(w)
    os.execv("/bin/sleep", ["sleep", "3600", token])
os.close(w)
assert os.read(r, 2) == b"up"
print("daemon holds its connection", flush=True)

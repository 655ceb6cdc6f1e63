"""Run by tests/test_e2e_load.py."""
import socket
import sys
import threading
import urllib.request
PER_THREAD, THREADS = int(sys.argv[1]), int(sys.argv[2])
failed = []

def http_door():
    with urllib.request.urlopen("http://api.github.com/", timeout=30) as r:
        r.read()

def socks_door():
    s = socket.create_connection(("127.0.0.1", 1080), timeout=30)
    name = b"api.github.com"
    s.sendall(b"\x05\x01\x00" + b"\x05\x01\x00\x03" + bytes([len(name)]) + name + (80).to_bytes(2, "big"))
    got = b""
    while len(got) < 2 + 10:
        chunk = s.recv(64)
        if not chunk:
            break
        got += chunk
    assert got[:2] == b"\x05\x00" and got[3] == 0, got
    s.sendall(b"GET / HTTP/1.0\r\nHost: api.github.com\r\n\r\n")
    while s.recv(65536):
        pass
    s.close()

def work(n):
    for i in range(PER_THREAD):
        try:
            (http_door if (n + i) % 2 else socks_door)()
        except Exception as exc:
            failed.append(repr(exc))

threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(failed), failed[:3])
sys.exit(1 if failed else 0)

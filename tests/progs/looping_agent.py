
import socket
import sys
import time
marker = sys.argv[1]
n = 0
while True:
    n += 1
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
        s.sendall(f"GET http://api.github.com/bytes/8?seed={marker}-{n} HTTP/1.1\r\n"
                  f"Host: api.github.com\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
        s.close()
        print(("ok" if reply.startswith(b"HTTP/1.1 200") else "bad"), n, flush=True)
    except OSError as exc:
        print("fail", n, type(exc).__name__, flush=True)
    time.sleep(0.02)

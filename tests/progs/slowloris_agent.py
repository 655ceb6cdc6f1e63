
import socket
import json
held = []
for i in range(200):
    s = socket.create_connection(("127.0.0.1", 3128 if i % 2 else 1080), timeout=10)
    s.sendall(b"G" if i % 2 else b"\x05")     # one byte, then nothing
    held.append(s)
results = []
for i in range(20):
    door = "http" if i % 2 else "socks"
    s = socket.create_connection(("127.0.0.1", 3128 if door == "http" else 1080), timeout=10)
    if door == "http":
        s.sendall(b"GET http://api.github.com/bytes/100?seed=sl HTTP/1.1\r\nHost: api.github.com\r\nConnection: close\r\n\r\n")
    else:
        s.sendall(b"\x05\x01\x00")
        assert s.recv(2) == b"\x05\x00"
        s.sendall(b"\x05\x01\x00\x03\x0eapi.github.com\x00\x50")
        reply = s.recv(10)
        assert reply[1] == 0, reply
        s.sendall(b"GET /bytes/100?seed=sl HTTP/1.1\r\nHost: api.github.com\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    results.append(data.startswith(b"HTTP/1.1 200"))
    s.close()
print(json.dumps({"served": sum(results), "held_open": sum(1 for h in held if h.fileno() >= 0)}))

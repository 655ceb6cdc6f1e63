"""Run by tests/test_e2e_evidence.py. N plain GETs through the HTTP door, one
after another, then a marker file: the marker proves the program ran to its
end; its absence, that it did not."""
import socket
import sys
n, done = int(sys.argv[1]), sys.argv[2]
for i in range(n):
    with socket.create_connection(("127.0.0.1", 3128), timeout=30) as s:
        s.sendall(b"GET http://api.github.com/whoami HTTP/1.1\r\nHost: api.github.com\r\n"
                  b"Connection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
with open(done, "w") as out:
    out.write(f"{n}\n")

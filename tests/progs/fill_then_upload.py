"""Run by tests/test_e2e_evidence.py. The issue-32 attack (finding 6): fill the
record's file system, then upload. Each GET names itself (?MARK-i), so the
web server's log shows which reached it; the program goes on until a GET is
refused."""
import errno
import socket
import sys
fill, mark, done = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    with open(fill, "wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
except OSError as e:
    assert e.errno == errno.ENOSPC, e
    print("disk full", flush=True)
for i in range(3000):
    with socket.create_connection(("127.0.0.1", 3128), timeout=30) as s:
        s.sendall(f"GET http://api.github.com/whoami?{mark}-{i} HTTP/1.1\r\nHost: api.github.com\r\n"
                  "Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    if not data.startswith(b"HTTP/1.1 200"):
        print("refused after", i, data.split(b"\r\n")[0].decode(), flush=True)
        break
else:
    open(done, "w").close()    # every upload went through

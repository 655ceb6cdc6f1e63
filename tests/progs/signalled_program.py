
import os
import signal
import socket
import sys
import time
marker, how = sys.argv[1], sys.argv[2]
conn = socket.create_connection(("127.0.0.1", 3128))
conn.sendall(b"CONNECT api.github.com:80 HTTP/1.1\r\nHost: api.github.com:80\r\n\r\n")
reply = b""
while b"\r\n\r\n" not in reply:
    chunk = conn.recv(4096)
    if not chunk:
        sys.exit("the door closed")
    reply += chunk
assert reply.startswith(b"HTTP/1.1 200"), reply
def got(signum, frame):
    with open(marker, "w") as out:
        out.write(f"got {signal.Signals(signum).name}\n")
    if how == "handle":
        conn.close()
        os._exit(42)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
signal.signal(signal.SIGINT, got)
signal.signal(signal.SIGTERM, got)
print("ready", flush=True)
while True:
    time.sleep(1)

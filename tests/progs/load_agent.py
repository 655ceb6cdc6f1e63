
import resource
import socket
import sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
GITHUB = socket.inet_aton("140.82.112.6")

def open_one(i):
    """A tunnel to api.github.com:80 through one of the doors, answered."""
    if i % 2:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
        s.sendall(b"CONNECT 140.82.112.6:80 HTTP/1.1\r\nHost: 140.82.112.6:80\r\n\r\n")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            chunk = s.recv(1)
            if not chunk:
                raise OSError("closed")
            head += chunk
        if not head.startswith(b"HTTP/1.1 200"):
            raise OSError(head[:40])
    else:
        s = socket.create_connection(("127.0.0.1", 1080), timeout=30)
        s.sendall(b"\x05\x01\x00\x05\x01\x00\x01" + GITHUB + b"\x00\x50")
        got = b""
        while len(got) < 12:
            chunk = s.recv(12 - len(got))
            if not chunk:
                raise OSError("closed")
            got += chunk
        if got[:2] != b"\x05\x00" or got[3] != 0:
            raise OSError(got)
    return s

def phase(name, count, at_once):
    failed = 0
    held = []
    for i in range(count):
        try:
            s = open_one(i)
        except OSError:
            failed += 1
            continue
        if at_once:
            held.append(s)
        else:
            s.close()
    if at_once:
        print(f"{name} held {len(held)}", flush=True)
        sys.stdin.readline()
        for s in held:
            s.close()
    print(f"{name} done failed={failed}", flush=True)
    sys.stdin.readline()

for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "warm":
        phase("warm", int(cmd[1]), False)
    elif cmd[0] == "seq":
        phase("seq", int(cmd[1]), False)
    elif cmd[0] == "once":
        phase("once", int(cmd[1]), True)
    elif cmd[0] == "quit":
        break

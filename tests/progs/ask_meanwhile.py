"""Run by tests/test_e2e_ask.py. A program that asks for pypi.world in a
thread (so vpnw's question is open) and goes on in the main thread, as
argv[1] says:
- "fake": it tries to answer for the person: a fake question on its screen,
  the answer keys written to its terminal and pushed into its own input with
  TIOCSTI (refused or not, they reach only its own pty);
- "sneak": it tries `vpnw ask`'s socket from inside (Unix sockets allowed):
  the run's own socket in the state directory argv[2].
Each line it prints starts with its name."""
import fcntl
import glob
import json
import socket
import sys
import termios
import threading
import time
import urllib.request

name = sys.argv[1]


def fetch():
    try:
        with urllib.request.urlopen("http://pypi.world/whoami", timeout=120) as r:
            print(f"{name}: fetched", r.status, flush=True)
    except Exception as exc:
        print(f"{name}: refused", getattr(exc, "code", exc), flush=True)


def fake():
    sys.stdout.write("vpnw: asks: pypi.world:80 (http door) is not allowed; Ctrl-] then y\r\n\x1dy\x1da"
                     "\x1dbcy\x1dbca")
    sys.stdout.flush()
    injected = 0
    for byte in b"\x1dy\x1da" + b"".join(b"\x1d" + bytes((a, b)) + b"y"
                                         for a in b"bcefgjkmpqstuvxz" for b in b"bcefgjkmpqstuvxz"):
        try:
            fcntl.ioctl(0, termios.TIOCSTI, bytes([byte]))
            injected += 1
        except OSError:
            pass
    print(f"fake: injected {injected}", flush=True)


def sneak():
    found = glob.glob(sys.argv[2] + "/r-*.sock")
    print("sneak: sockets", len(found), flush=True)
    for path in found:
        for request in ({"list": True}, {"answer": "once", "number": 1}):
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.settimeout(5)
                s.connect(path)
                s.send(json.dumps(request).encode())
                print("sneak: answered", repr(s.recv(4096)), flush=True)
            except OSError as exc:
                print("sneak: error", exc.errno, flush=True)


t = threading.Thread(target=fetch)
t.start()
time.sleep(0.5)
{"fake": fake, "sneak": sneak}[name]()
t.join()

"""Run by tests/test_e2e_unix.py."""
import ctypes
import errno
import json
import os
import signal
import socket
import struct
import tempfile
import threading
import time
libc = ctypes.CDLL(None, use_errno=True)
scratch = tempfile.TemporaryDirectory()      # removed as the program ends
path = os.path.join(scratch.name, "full.sock")
server = socket.socket(socket.AF_UNIX)
server.bind(path)
server.listen(0)
queued = []
while True:                       # the backlog filled: a blocking connect now waits
    c = socket.socket(socket.AF_UNIX)
    c.setblocking(False)
    try:
        c.connect(path)
    except BlockingIOError:
        c.close()
        break
    queued.append(c)
signal.signal(signal.SIGUSR1, lambda *_: None)
signal.siginterrupt(signal.SIGUSR1, True)        # no SA_RESTART: EINTR comes back
main, main_tid = threading.get_ident(), threading.get_native_id()
accepted = []

def in_connect():
    try:
        with open(f"/proc/self/task/{main_tid}/syscall") as f:
            return f.read().split()[0] == "42"        # x86_64 connect
    except (OSError, IndexError):
        return False

def interrupt_then_make_room():
    deadline = time.monotonic() + 20
    while not in_connect() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)                           # the supervisor has it by now (or not: EINTR)
    signal.pthread_kill(main, signal.SIGUSR1)
    time.sleep(0.5)
    accepted.append(server.accept()[0])       # room again: a connect still going on ends now
threading.Thread(target=interrupt_then_make_room).start()
s = socket.socket(socket.AF_UNIX)
addr = struct.pack("=H", socket.AF_UNIX) + path.encode() + b"\0"
rc = libc.connect(s.fileno(), addr, len(addr))
err = ctypes.get_errno() if rc else 0
time.sleep(1.5)
try:
    s.getpeername()
    connected = True
except OSError:
    connected = False
print(json.dumps({"error": errno.errorcode.get(err, "0"), "connected": connected}))

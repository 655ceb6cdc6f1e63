"""Run by tests/test_e2e_channel.py. Watches "." (the policy's directory) and
renames a permissive policy over every name that appears there, while the
person is asked; then writes the policy itself. argv: flag file that ends
the watch, then a URL to fetch (none: the control, outside)."""
import ctypes
import os
import struct
import sys
import threading
import time
import urllib.request
EVIL = 'version = 1\n[policy]\ndefault = "allow"\n'
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_NONBLOCK)
libc.inotify_add_watch(fd, b".", 0x100 | 0x80)          # IN_CREATE | IN_MOVED_TO
print("swap: watching", flush=True)
saw, swapped = [], []
stop = sys.argv[1]
ours = {"agent.toml", os.path.basename(stop)}
def watch():
    n = 0
    while not os.path.exists(stop):
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.0005)
            continue
        i = 0
        while i < len(data):
            _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, i)
            name = data[i + 16:i + 16 + size].rstrip(b"\0").decode()
            i += 16 + size
            if name.startswith("evil-") or name in ours or name in swapped:
                continue
            saw.append(name)
            n += 1
            mine = f"evil-{n}"
            with open(mine, "w") as f:
                f.write(EVIL)
            try:
                os.rename(mine, name)
                swapped.append(name)
            except OSError:
                os.unlink(mine)
t = threading.Thread(target=watch)
t.start()
if len(sys.argv) > 2:
    try:
        with urllib.request.urlopen(sys.argv[2], timeout=120) as r:
            print("swap: fetched", r.status, flush=True)
    except Exception as exc:
        print("swap: refused", getattr(exc, "code", exc), flush=True)
t.join()
try:
    with open("agent.toml", "a") as f:
        f.write('\n# the program was here\n')
    print("direct: written", flush=True)
except OSError as exc:
    print("direct: error", exc.errno, flush=True)
print(f"swap: saw {saw} swapped {swapped}", flush=True)

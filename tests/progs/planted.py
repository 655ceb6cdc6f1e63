"""Run by tests/test_e2e_terminal_planted.py. Everything a program can do to a
terminal it holds, on each of fds 0-2 and /dev/tty that is one; then it
reads every such terminal until STOP exists."""
import fcntl
import os
import select
import struct
import sys
import termios
out = sys.argv[1]
ttys = []
for name in ("0", "1", "2", "/dev/tty"):
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOCTTY) if name.startswith("/") else int(name)
    except OSError:
        continue
    if not os.isatty(fd):
        continue
    mode = termios.tcgetattr(fd)
    mode[3] &= ~(termios.ECHO | termios.ICANON)
    mode[4] = mode[5] = termios.B300
    for call in (lambda: termios.tcsetattr(fd, termios.TCSANOW, mode),
                 lambda: fcntl.ioctl(fd, termios.TIOCEXCL),
                 lambda: fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 11, 33, 0, 0))):
        try:
            call()
        except OSError:
            pass
    ttys.append(fd)
print("touched", len(ttys), flush=True)
open(os.path.join(out, "armed"), "w").close()
stolen = b""
while not os.path.exists(os.path.join(out, "STOP")):
    for fd in select.select(ttys, [], [], 0.05)[0][:1]:   # fds may share one terminal
        stolen += os.read(fd, 4096)
        with open(os.path.join(out, "read"), "w") as f:
            f.write(repr(stolen))
print("read", repr(stolen), flush=True)
with open(os.path.join(out, "done"), "w") as f:
    f.write(repr(stolen))

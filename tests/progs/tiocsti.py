"""Run by tests/test_e2e_terminal.py."""
import errno
import fcntl
import os
import termios
for name in ("/dev/tty", "fd 0"):
    fd = os.open(name, os.O_RDWR) if name.startswith("/") else 0
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b"X")
        print("injected", name)
    except OSError as e:
        print("refused", name, errno.errorcode[e.errno])
try:
    fcntl.ioctl(0, 0x541C, bytes([12]))   # TIOCLINUX
    print("tioclinux answered")
except OSError as e:
    print("tioclinux", errno.errorcode[e.errno])

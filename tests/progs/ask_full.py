"""Run by tests/test_e2e_ask.py. A full-screen program: a picture on the
alternate screen, a connection, its result drawn in place, then it waits for
"q"."""
import sys
import termios
import tty
import urllib.request
out = sys.stdout
fd = sys.stdin.fileno()
saved = termios.tcgetattr(fd)
tty.setraw(fd)
out.write("\x1b[?1049h\x1b[H\x1b[2J")
for row in range(1, 11):
    out.write(f"\x1b[{row};1H|{'FULL SCREEN PICTURE row ' + str(row):^40}|")
out.flush()
try:
    with urllib.request.urlopen("http://pypi.world/whoami", timeout=120) as r:
        status = r.status
except Exception as exc:
    status = getattr(exc, "code", "error")
out.write(f"\x1b[12;1Hstatus {status}; q quits")
out.flush()
while sys.stdin.read(1) != "q":
    pass
out.write("\x1b[?1049l")
out.flush()
termios.tcsetattr(fd, termios.TCSADRAIN, saved)
print("left the full screen")

"""Run by tests/test_e2e_terminal.py. The identity of a terminal's name, and
whether it can be opened and written."""
import json
import os
import sys
path = sys.argv[1]
try:
    st = os.stat(path)
    seen = [st.st_dev, st.st_ino]
except OSError as e:
    seen = e.strerror
try:
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)
    os.write(fd, b"written from the program")
    opened = True
except OSError:
    opened = False
print("SEEN " + json.dumps({"stat": seen, "opened": opened, "own": os.ttyname(0),
                           "entries": sorted(os.listdir("/dev/pts"))}))

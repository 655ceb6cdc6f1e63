"""Run by tests/test_e2e_terminal_planted.py."""
import os
import sys
import time
import urllib.request
go = sys.argv[1]
sys.stdout.write("\x1b[?1;1049h\x1b[H\x1b[2Jon the alternate screen\r\n")
sys.stdout.flush()
try:
    urllib.request.urlopen("http://api.github.com/", timeout=30)
except Exception:
    pass
while not os.path.exists(go):
    time.sleep(0.02)
sys.stdout.write("\x1b[?1;1049lback on the normal screen\n")

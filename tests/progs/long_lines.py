"""Run by tests/test_e2e_terminal.py. Many connections at once (each one a
trace line or three) while the main thread prints long lines, each written
in several pieces. argv: N, then "stderr" to print them there instead."""
import sys
import threading
import time
import urllib.request

N = int(sys.argv[1])
def fetch(i):
    for _ in range(3):
        urllib.request.urlopen("http://api.github.com/whoami", timeout=60).read()
threads = [threading.Thread(target=fetch, args=(i,)) for i in range(N)]
for t in threads:
    t.start()
out = sys.stderr if sys.argv[2:] == ["stderr"] else sys.stdout
for i in range(200):
    out.write(f"L{i:04d}:")
    out.flush()
    for piece in range(6):
        out.write("x" * 40)
        out.flush()
        time.sleep(0.001)
    out.write(":END\n")
    out.flush()
for t in threads:
    t.join()
print("all done")

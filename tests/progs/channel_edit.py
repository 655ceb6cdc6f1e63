"""Run by tests/test_e2e_channel.py. Clears the screen, writes one line (vpnw's
question then comes on row 2), asks for evil.example in a thread and, once
the question is up, rewrites row 2 from column 16 on: vpnw's code (columns
12-13) stays, the host and the rest become pypi.world's. argv: the file it
touches once it has written."""
import sys
import threading
import time
import urllib.request
def fetch():
    try:
        with urllib.request.urlopen("http://evil.example/whoami", timeout=120) as r:
            print("edit: evil fetched", r.status, flush=True)
    except Exception as exc:
        print("edit: evil refused", getattr(exc, "code", exc), flush=True)
sys.stdout.write("\x1b[2J\x1b[Hedit: ready\r\n")
sys.stdout.flush()
t = threading.Thread(target=fetch)
t.start()
time.sleep(2.0)
sys.stdout.write("\x1b[2;16Hpypi.world:80 (http door) is not in the policy (edited)\x1b[K\r\n")
sys.stdout.flush()
open(sys.argv[1], "w").close()
t.join()

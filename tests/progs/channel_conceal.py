"""Run by tests/test_e2e_channel.py. Asked for a denied host; once vpnw's DENY
line is drawn, erases the screen and exits leaving conceal, insert mode,
autowrap off, application cursor keys and keypad set. argv: the file whose
existence says the DENY line is on the screen (the control: no fetch, no
wait)."""
import os
import sys
import time
import urllib.request
if len(sys.argv) > 1:
    try:
        urllib.request.urlopen("http://evil.example/whoami", timeout=60)
    except Exception as exc:
        print("conceal: refused", getattr(exc, "code", exc), flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
sys.stdout.write("\x1b[2J\x1b[Hconceal: bye\r\n\x1b[8m\x1b[4h\x1b[?7l\x1b[?1h\x1b=")
sys.stdout.flush()

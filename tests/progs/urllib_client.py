"""Run by tests/test_e2e_clients.py."""
import ssl
import sys
import urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[1])
for url in ("http://api.github.com/whoami", "https://api.github.com/whoami"):
    with urllib.request.urlopen(url, context=ctx, timeout=30) as resp:
        print(resp.read().decode().strip())

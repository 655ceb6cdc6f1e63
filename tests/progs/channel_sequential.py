"""Run by tests/test_e2e_channel.py. Fetches its URLs one after the other (each
a connection of its own); https without checking the certificate (only the
door's decision matters)."""
import ssl
import sys
import urllib.request
ok = 0
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=120, context=ssl._create_unverified_context()) as r:
            print(f"{url} -> {r.status}", flush=True)
            ok += 1
    except Exception as exc:
        print(f"{url} -> error {getattr(exc, 'code', exc)}", flush=True)
print(f"fetched {ok} of {len(sys.argv) - 1}", flush=True)

"""Run by tests/test_e2e_ask.py."""
import sys
import threading
import urllib.request
urls = sys.argv[1:]
results = {}
def get(i, url):
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            results[i] = f"{url} -> {r.status}"
    except Exception as exc:
        results[i] = f"{url} -> error {getattr(exc, 'code', exc)}"
threads = [threading.Thread(target=get, args=(i, u)) for i, u in enumerate(urls)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ok = sum(" -> 200" in r for r in results.values())
print(f"fetched {ok} of {len(urls)}", flush=True)
for i in sorted(results):
    print(results[i])

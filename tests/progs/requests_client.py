"""Run by tests/test_e2e_clients.py."""
import requests
with requests.Session() as s:
    for url in ("https://api.github.com/whoami", "https://files.pythonhosted.org/whoami",
                "http://pypi.world/bytes/100000?seed=3"):
        r = s.get(url, timeout=30)
        r.raise_for_status()
        print(len(r.content) if "bytes" in url else r.json()["host"])

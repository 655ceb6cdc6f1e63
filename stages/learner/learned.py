"""What a draft is made from: the recorded runs' events gathered into a
`Learner` (runs, destinations, Unix sockets, held writes, the keys the
program held), pure and bounded: memory grows with the number of distinct
destinations, never with the length of the record. draft.py writes it out.
"""
from __future__ import annotations

import re
from typing import Iterable

from stages.record.destinations import Tally


# OpenSSH's agent socket, made afresh at each login (ssh-agent's and sshd's
# forwarded one: $TMPDIR/ssh-XXXXXXXXXX/agent.<pid>): a policy naming the path
# is stale at the next login; "$SSH_AUTH_SOCK" is read when each run starts.
_SSH_AGENT_PATH = re.compile(r"^/(?:[^\0]*/)?ssh-[A-Za-z0-9]{6,}/agent\.\d+$")
SSH_AUTH_SOCK = "$SSH_AUTH_SOCK"


def _unix_key(path: str, ssh_auth_sock: str | None) -> str:
    """How a draft names a refused socket: the variable for the ssh agent's."""
    if (ssh_auth_sock and path == ssh_auth_sock) or _SSH_AGENT_PATH.match(path):
        return SSH_AUTH_SOCK
    return path


class Learner:
    """The events of the runs a draft is learned from, gathered."""

    def __init__(self, ssh_auth_sock: str | None = None):
        self.ssh_auth_sock = ssh_auth_sock      # the learner's own $SSH_AUTH_SOCK (None: unset)
        self.tally = Tally()
        self.runs: dict[str, tuple] = {}
        self.first_program: str | None = None
        # [unix]: entry or path -> (connects, programs), allowed by the policy / refused
        self.unix_allowed: dict[str, tuple[int, set]] = {}
        self.unix_refused: dict[str, tuple[int, set]] = {}
        self.captured = False   # a run captured what ignores the proxy settings (--capture)
        self.paths: set[tuple] = set()   # (via, config) of each run: the guard command keeps them
        # files.held: folder suggested for allow_write -> (writes held, what runs it later or None)
        self.held: dict[str, tuple[int, str | None]] = {}
        self.keys_given: set[str] = set()    # run.start's keys_given: API keys the program held

    def feed(self, event: dict) -> None:
        type_ = event.get("type")
        f = event.get("fields")
        if not isinstance(f, dict):
            return
        ts = event.get("ts") if isinstance(event.get("ts"), str) else None
        if type_ == "run.start":
            run = str(event.get("run"))
            if run not in self.runs:
                self.runs[run] = (ts or "", str(f.get("mode", "?")), str(f.get("program", "?")))
            if self.first_program is None and isinstance(f.get("program"), str):
                self.first_program = f["program"]
            self.captured = self.captured or f.get("capture") is True
            via = f.get("via") if isinstance(f.get("via"), str) else event.get("path")
            config = f.get("config") if isinstance(f.get("config"), str) else None
            self.paths.add((via if isinstance(via, str) else "direct", config))
            keys = f.get("keys_given")
            if isinstance(keys, list):
                self.keys_given.update(k for k in keys if isinstance(k, str))
            return
        if type_ in ("unix.allow", "unix.deny"):
            self._unix(type_, f)
            return
        if type_ == "files.held":
            self._held(f)
            return
        self.tally.feed(event)

    def _held(self, f: dict) -> None:
        entries = f.get("entries")
        if not isinstance(entries, list):
            return
        for e in entries[:_MAX_HELD_READ]:
            if not isinstance(e, dict) or not isinstance(e.get("path"), str):
                continue
            key = held_folder(e["path"])
            if key is None:
                continue
            later = e.get("runs_later") if isinstance(e.get("runs_later"), str) else None
            count, was_later = self.held.get(key, (0, None))
            if len(self.held) < _MAX_HELD_FOLDERS or key in self.held:
                self.held[key] = (count + 1, was_later or later)

    def _unix(self, type_: str, f: dict) -> None:
        """A socket the policy named is kept; a socket bound outside that was
        refused is suggested, commented out. An abstract name or a path through
        /proc cannot be named by a policy: not suggested."""
        if type_ == "unix.allow":
            key, table = f.get("rule"), self.unix_allowed
        elif f.get("reason") == "a socket bound outside the sandbox":
            key, table = f.get("path"), self.unix_refused
            if isinstance(key, str):
                key = _unix_key(key, self.ssh_auth_sock)
        else:
            return
        if not isinstance(key, str) or not key:
            return
        count, programs = table.get(key, (0, set()))
        if isinstance(f.get("program"), str) and len(programs) < 8:
            programs.add(f["program"])
        table[key] = (count + 1, programs)



_MAX_HELD_READ = 10_000
_MAX_HELD_FOLDERS = 40


def held_folder(path: str) -> str | None:
    """The allow_write entry a held write suggests: the folder a tool keeps
    its state in (the one under the first dot-folder: ~/.cache/pip for
    ~/.cache/pip/http/x), a dot-file itself, or else the file's folder."""
    if not path.startswith("/") or "\x00" in path:
        return None
    parts = [p for p in path.split("/") if p]
    if not parts or ".." in parts:
        return None
    for i, part in enumerate(parts):
        if part.startswith("."):
            return "/" + "/".join(parts[: min(i + 2, len(parts))])
    return "/" + "/".join(parts[:-1]) if len(parts) > 1 else "/" + parts[0]



class NoRuns(ValueError):
    """The events held no run.start: there is nothing to learn from."""


def learn(events: Iterable[dict], ssh_auth_sock: str | None = None) -> Learner:
    """Recorded events (one run or several, in any order of runs) gathered;
    NoRuns when they hold no run: an empty draft would allow nothing and say
    it was learned."""
    learner = Learner(ssh_auth_sock)
    for event in events:
        if isinstance(event, dict):
            learner.feed(event)
    if not learner.runs:
        raise NoRuns("no run.start among the events")
    return learner

"""File limits: a policy's [files] table, resolved once for one run.

    FileRules (stages.config.policy_tables: the words)  --resolve-->  FileLimits (this run's paths)
                                                        --to_helper()--> what init mounts
                                                        --to_record()--> run.start's "files"

What the words mean (decided here, once, before the program starts):
- `~` is the invoking user's home: $HOME when it is an absolute path, else the
  home of the uid vpnw runs as. Under sudo (uid 0 with SUDO_USER naming
  another user) a root program can read that user's home too, so each
  `~` entry of deny_read is hidden in both homes; `~` in allow_write means
  root's home only (writes are never widened by a guess).
- `.` is the directory vpnw was started in.
- Every path goes through realpath: a symlink is judged by what it points to,
  so hiding `~/.aws` when it is a link hides the directory it names.
- A deny_read path that does not exist is recorded as absent: there is
  nothing to hide when the program starts and no mount can be made on
  a path that is not there (nor should vpnw create files on the host to make
  one). Outside allow_write the program cannot create it; inside, whatever it
  creates there is its own. A file the host itself creates there during the
  run is visible: see docs/security.md.
- An allow_write path must exist (exit 121 otherwise): the bind mount that
  makes it writable needs it, and a typo must not silently leave it read-only.
- `/` in allow_write lifts the write limit (everything is writable).
- deny_read wins over allow_write: a denied path inside a writable tree
  stays hidden and read-only.
- vpnw refuses to start inside a denied directory (the program would start
  in a hidden, empty place) and refuses to hide `/`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from stages.config.lookups import invoker_homes, locate  # noqa: F401  (resolve uses them; callers find them here too)
from stages.config.errors import PolicyError
from stages.config.policy_tables import FileEntry, FileRules

# The record's run.start line must stay below record.MAX_LINE; past this many
# characters of paths, the rest is counted, not listed.
RECORD_PATH_CHARS = 2400


@dataclass(frozen=True)
class Limit:
    """One [files] entry resolved for this run."""
    written: str       # as in the policy
    line: int | None
    path: str          # absolute, symlinks resolved
    kind: str          # "dir" | "file" | "absent"


@dataclass(frozen=True)
class MountPlan:
    """A run's [files] limits as the helper enforces them: paths to hide
    (path, "dir" | "file"), and, when writes are limited, the writable paths
    and the Landlock ABI to use for them (0: mounts only)."""
    hide: tuple[tuple[str, str], ...]
    limit_writes: bool
    writable: tuple[tuple[str, str], ...]
    landlock_abi: int


@dataclass(frozen=True)
class FileLimits:
    """A policy's [files] table resolved for one run."""
    deny_read: tuple[Limit, ...]
    allow_write: tuple[Limit, ...] | None    # None: no write limit
    source: str | None = None
    outside: str = "read-only"               # "held": outside allow_write, the held layer

    @property
    def limits_writes(self) -> bool:
        return self.allow_write is not None and not any(l.path == "/" for l in self.allow_write)

    def hidden(self) -> list[Limit]:
        """The deny_read paths to mount over: existing ones, none inside another."""
        out: list[Limit] = []
        for limit in sorted(self.deny_read, key=lambda l: (len(l.path), l.path)):
            if limit.kind == "absent" or any(_within(limit.path, h.path) for h in out):
                continue
            out.append(limit)
        return out

    def writable(self) -> list[Limit]:
        """The allow_write paths to bind writable: none inside another, none
        inside a hidden path (deny_read wins; the path is not there to bind)."""
        if not self.limits_writes:
            return []
        hidden = self.hidden()
        out: list[Limit] = []
        for limit in sorted(self.allow_write, key=lambda l: (len(l.path), l.path)):
            if not any(_within(limit.path, w.path) for w in out) \
                    and not any(_within(limit.path, h.path) for h in hidden if h.kind == "dir"):
                out.append(limit)
        return out

    @property
    def held(self) -> bool:
        """Writes outside allow_write go to the run's held layer (outside = "held")."""
        return self.outside == "held" and self.limits_writes

    def to_helper(self, landlock_abi: int) -> "MountPlan":
        """What the helper's init mounts and its program's Landlock ruleset enforce
        (no Landlock with the held layer: the writes it holds must succeed)."""
        return MountPlan(hide=tuple((l.path, l.kind) for l in self.hidden()),
                         limit_writes=self.limits_writes,
                         writable=tuple((l.path, l.kind) for l in self.writable()),
                         landlock_abi=landlock_abi if self.limits_writes and not self.held else 0)

    def layers(self, landlock_abi: int) -> dict:
        return {"deny_read": ["mount"] if self.deny_read else [],
                "allow_write": (["mount", "landlock"] if landlock_abi and not self.held else ["mount"])
                if self.limits_writes else []}

    def to_record(self, landlock_abi: int) -> dict:
        """run.start's "files": the resolved paths and the layers enforcing them."""
        budget = [RECORD_PATH_CHARS]

        def listed(limits):
            shown = []
            for l in limits:
                if budget[0] < len(l.path):
                    break
                budget[0] -= len(l.path) + 3
                shown.append(l.path)
            return shown

        deny = [l for l in self.deny_read if l.kind != "absent"]
        absent = [l for l in self.deny_read if l.kind == "absent"]
        out = {"layers": self.layers(landlock_abi),
               "deny_read": listed(deny),
               "deny_read_absent": listed(absent),
               "allow_write": None if self.allow_write is None else listed(self.allow_write),
               "landlock_abi": landlock_abi}
        unlisted = (len(deny) - len(out["deny_read"]) + len(absent) - len(out["deny_read_absent"])
                    + (0 if self.allow_write is None else len(self.allow_write) - len(out["allow_write"])))
        if unlisted:
            out["unlisted"] = unlisted
        return out


def _within(path: str, top: str) -> bool:
    return path == top or top == "/" or path.startswith(top + "/")


def expand(text: str, home: str, cwd: str) -> str:
    """One written path -> an absolute, normalised path (no file system access)."""
    if text == "~" or text.startswith("~/"):
        path = home + text[1:]
    elif text == "." or text.startswith("./") or text == ".." or text.startswith("../"):
        path = os.path.join(cwd, text)
    else:
        path = text
    path = os.path.normpath(path)
    return "/" + path.lstrip("/")   # normpath keeps a leading "//"


def resolve(rules: FileRules, source: str | None, *, home: str, cwd: str,
            other_homes: tuple[str, ...] = (), locate=locate) -> FileLimits:
    """FileRules -> FileLimits for this machine, or PolicyError (file:line: problem; fix)."""
    problems: list[tuple[int, str]] = []
    where = source or "policy"

    def problem(entry: FileEntry, what: str, fix: str) -> None:
        line = entry.line or 1
        problems.append((line, f"{where}:{line}: {what}; fix: {fix}"))

    def resolved(entry: FileEntry, homes) -> list[Limit]:
        out = []
        for h in homes:
            out.append(Limit(entry.text, entry.line, *locate(expand(entry.text, h, cwd))))
            if not (entry.text == "~" or entry.text.startswith("~/")):
                break
        return out

    deny: list[Limit] = []
    seen: set[str] = set()
    for entry in rules.deny_read:
        for limit in resolved(entry, (home, *other_homes)):
            if limit.path == "/":
                problem(entry, f'deny_read "{entry.text}" hides the whole file system',
                        "name the directories to hide, not /")
            elif limit.kind == "dir" and _within(os.path.realpath(cwd), limit.path):
                problem(entry, f'vpnw was started in {cwd}, inside the denied "{entry.text}"',
                        "start vpnw in another directory, or take the path out of deny_read")
            elif limit.path not in seen:
                seen.add(limit.path)
                deny.append(limit)
    write: list[Limit] | None = None
    if rules.allow_write is not None:
        write = []
        seen = set()
        for entry in rules.allow_write:
            for limit in resolved(entry, (home,)):
                if limit.kind == "absent" and rules.outside == "held":
                    continue    # not there: what the program writes there is held
                if limit.kind == "absent":
                    problem(entry, f'allow_write "{entry.text}" ({limit.path}) does not exist',
                            "create it before the run, or take it out of allow_write")
                elif limit.path not in seen:
                    seen.add(limit.path)
                    write.append(limit)
    if problems:
        problems.sort(key=lambda p: p[0])
        raise PolicyError("\n".join(m for _, m in problems), source=source, line=problems[0][0])
    return FileLimits(tuple(deny), None if write is None else tuple(write), source,
                      rules.outside)

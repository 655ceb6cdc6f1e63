"""The policy file's [files] table (the file limits' words) and [unix] table
(sockets outside the sandbox the program may reach); [secrets.NAME] is
policy_secrets.py's. Each parser checks only the words (type, form) and
adds what is wrong to the file's Problems; what a path means on this
machine is decided when a run starts. Nothing here parses an address:
file_limits.py takes FileEntry and FileRules from here without ipaddress."""
from __future__ import annotations

import re

from stages.config.policy_problems import Problems, show, string_list, type_name, unknown
from stages.startup.records import NamedTuple   # not typing's (docs/architecture.md "Start-up budget")

UNIX_KEYS = ("allow",)
# Patterns as text, compiled (and cached by re) on first use: a policy
# without such an entry never compiles them (tests/test_start_patterns.py).
_ENV_NAME = r"\$[A-Za-z_][A-Za-z0-9_]*"

# --- the [files] table (file limits) ------------------------------------------
#
#     [files]
#     deny_read = ["~/.ssh", "~/.aws", "~/.netrc"]   # hidden: empty, read-only
#     allow_write = [".", "/tmp"]                    # everything else is read-only
#     outside = "held"                               # ...or held (docs/security.md)
#
# Here only the words are checked (type, form). What a path means on this
# machine (~, ., symlinks, whether it exists) is decided once per run, before
# the program starts, by stages.config.file_limits.resolve.

FILES_KEYS = ("deny_read", "allow_write", "outside")
FILES_LISTS = ("deny_read", "allow_write")
# outside: what writes outside allow_write meet (stages/config/work_set.py).
FILES_OUTSIDE = ("read-only", "held")


class FileEntry(NamedTuple):
    """One path of the [files] table, as written."""
    text: str                      # as written: "~/.ssh", ".", "/tmp"
    line: int | None


class FileRules(NamedTuple):
    """The [files] table as written."""
    deny_read: tuple[FileEntry, ...] = ()
    allow_write: tuple[FileEntry, ...] | None = None   # None: no write limit (key absent)
    outside: str = "read-only"     # "held": writes outside allow_write go to the held layer


def check_file_entry(text: str) -> tuple[str, str] | None:
    """None when `text` is a path a [files] list can hold; else (problem, fix)."""
    if text == "":
        return "the path is empty", 'remove it, or write a path such as "~/.ssh"'
    if "\0" in text or not text.isprintable():
        return "the path holds control characters", "write the path in plain characters"
    if text.startswith("~") and not (text == "~" or text.startswith("~/")):
        return ("~user is not supported", "write ~/ for the invoking user's home, "
                "or the other user's home as an absolute path")
    if not (text.startswith(("/", "~")) or text == "." or text.startswith("./")
            or text == ".." or text.startswith("../")):
        return ("a path must be absolute or start with ~ or .",
                f'write "./{text}" (relative to where vpnw starts) or an absolute path')
    return None




def parse_unix(data: dict, problems: Problems) -> tuple[str, ...]:
    """[unix] allow: Unix sockets outside the sandbox the program may connect
    to, each an absolute path or $VARIABLE (resolved when a run starts:
    unix_sockets_named)."""
    if "unix" not in data:
        return ()
    body = data["unix"]
    if not isinstance(body, dict):
        problems.add(("unix",), f"unix is {type_name(body)}, not a table",
                     'write [unix] on a line of its own, with allow = ["$SSH_AUTH_SOCK"] below it')
        return ()
    for key in body:
        if key not in UNIX_KEYS:
            problems.add(("unix", key), f'unknown key "{key}" in [unix]', unknown(key, UNIX_KEYS))
    entries = []
    for index, text, path in string_list(
            problems, ("unix", "allow"), body.get("allow", []),
            'write allow = ["$SSH_AUTH_SOCK", "/run/postgresql/.s.PGSQL.5432"]',
            'write each socket in quotes, as "$SSH_AUTH_SOCK"') or ():
        if not (text.startswith("/") or re.fullmatch(_ENV_NAME, text)) or "\0" in text:
            problems.add(path, f"allow[{index}] {show(text)}: not an absolute path or $VARIABLE",
                         'write the socket\'s full path ("/run/postgresql/.s.PGSQL.5432") or the variable '
                         'that holds it ("$SSH_AUTH_SOCK")')
            continue
        entries.append(text)
    return tuple(entries)



def parse_files(data: dict, problems: Problems) -> FileRules | None:
    if "files" not in data:
        return None
    body = data["files"]
    if not isinstance(body, dict):
        problems.add(("files",), f"files is {type_name(body)}, not a table",
                     "write [files] on a line of its own, with deny_read and allow_write below it")
        return None
    for key in body:
        if key not in FILES_KEYS:
            problems.add(("files", key), f'unknown key "{key}" in [files]', unknown(key, FILES_KEYS))
    lists: dict[str, tuple[FileEntry, ...] | None] = {}
    outside = body.get("outside", "read-only")
    if outside not in FILES_OUTSIDE:
        problems.add(("files", "outside"),
                     f"outside = {show(outside) if isinstance(outside, str) else type_name(outside)}: "
                     f"not one of " + ", ".join(f'"{v}"' for v in FILES_OUTSIDE),
                     'write outside = "held" (writes outside allow_write are held for you to '
                     'look at after the run) or outside = "read-only" (they fail)')
        outside = "read-only"
    for which in FILES_LISTS:
        if which not in body:
            lists[which] = None
            continue
        entries = []
        for index, text, path in string_list(
                problems, ("files", which), body[which],
                f'write {which} = ["~/.ssh", "./secrets"]' if which == "deny_read"
                else f'write {which} = [".", "/tmp"]',
                'write each path in quotes, as "~/.ssh"') or ():
            bad = check_file_entry(text)
            if bad:
                problems.add(path, f"{which}[{index}] {show(text)}: {bad[0]}", bad[1])
                continue
            entries.append(FileEntry(text, problems.line_of(path)))
        lists[which] = tuple(entries)
    return FileRules(deny_read=lists["deny_read"] or (), allow_write=lists["allow_write"],
                     outside=outside)

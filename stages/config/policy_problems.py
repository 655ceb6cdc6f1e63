"""How a policy file's problems are collected and said: `Problems` (every
problem of one file, sorted by line, at most MAX_PROBLEMS, raised as one
PolicyError), and how a value from the file is shown in a message. Shared
by the policy's own keys (policy_file.py) and its tables (policy_tables.py).
"""
from __future__ import annotations

from stages.config.errors import PolicyError
from stages.config import toml_lines
from stages.record.text import printable

MAX_PROBLEMS = 20


def show(value) -> str:
    # A value from the file goes into a one-line message: no line breaks or
    # control characters of its own (a "\r" once split a message in two).
    text = repr(value) if not isinstance(value, str) else '"' + printable(value) + '"'
    return text if len(text) <= 60 else text[:57] + "..."


def type_name(value) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), "a date or time")


class Problems:
    """Every problem of one policy file, each at its line; raise_if_any
    makes them one PolicyError, first line first."""

    def __init__(self, source: str, lines: dict[tuple, int]):
        self.source = source
        self.lines = lines
        self.found: list[tuple[int, str]] = []

    def line_of(self, path: tuple) -> int:
        return toml_lines.line_of(self.lines, path) or 1

    def add(self, path: tuple, what: str, fix: str) -> None:
        line = self.line_of(path)
        self.found.append((line, f"{self.source}:{line}: {what}; fix: {fix}"))

    def raise_if_any(self) -> None:
        if self.found:
            self.found.sort(key=lambda item: item[0])
            first = self.found[0][0]
            messages = [m for _, m in self.found[:MAX_PROBLEMS]]
            if len(self.found) > MAX_PROBLEMS:
                messages.append(f"{self.source}: ... and {len(self.found) - MAX_PROBLEMS} more problems")
            raise PolicyError("\n".join(messages), source=self.source, line=first)


def unknown(key: str, known: tuple) -> str:
    import difflib    # only for a mistake: not on every run's start-up
    near = difflib.get_close_matches(key, known, n=1)
    if near:
        return f'did you mean "{near[0]}"?'
    return "the keys allowed here are " + ", ".join(known)


def string_list(problems, key: tuple, value, fix_list: str, fix_item: str):
    """The strings of a list setting (allow, deny, deny_read, allow_write), each
    with its index and key path for messages; None when it is not a list. An
    entry that is not a string is reported and skipped."""
    which = key[-1]
    if not isinstance(value, list):
        problems.add(key, f"{which} is {type_name(value)}, not an array", fix_list)
        return None
    items = []
    for index, item in enumerate(value):
        path = (*key, index)
        if not isinstance(item, str):
            problems.add(path, f"{which}[{index}] is {type_name(item)}, not a string", fix_item)
            continue
        items.append((index, item, path))
    return items


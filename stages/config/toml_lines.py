"""Where a key stands in a TOML file: the line numbers vpnw's error messages
name ("agent.toml:9: ...; fix: ..."), for the policy and the paths config.

tomllib reports no line numbers for values, so `key_lines` re-reads the
source text with a small TOML scanner to find the line of each key, table and
array item; `line_of` gives the most precise line known for a key path.
"""
from __future__ import annotations

import re

_TOKEN = re.compile(r"""
    (?P<nl>\r?\n)
  | (?P<ws>[ \t]+)
  | (?P<comment>\#[^\n]*)
  | (?P<mlbasic>\"\"\"(?:[^\\]|\\.)*?\"\"\"\"{0,2})
  | (?P<mllit>'''.*?''''{0,2})
  | (?P<basic>"(?:[^"\\\n]|\\.)*")
  | (?P<lit>'[^'\n]*')
  | (?P<punct>[\[\]{}=,.])
  | (?P<bare>[^\s\[\]{}=,.\#"']+)
""", re.VERBOSE | re.DOTALL)


def _tokens(text: str):
    line, pos = 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            pos += 1
            continue
        kind, value = m.lastgroup, m.group()
        if kind not in ("ws", "comment"):
            if kind in ("basic", "lit"):
                yield "key", value[1:-1] if kind == "lit" else _unquote(value), line
            elif kind in ("mlbasic", "mllit"):
                yield "str", value, line
            elif kind == "punct":
                yield value, value, line
            elif kind == "nl":
                yield "nl", value, line
            else:
                yield "key", value, line
        line += value.count("\n")
        pos = m.end()


def _unquote(literal: str) -> str:
    if "\\" not in literal:
        return literal[1:-1]
    import tomllib    # an escaped key is rare: not on every run's start-up
    try:
        return tomllib.loads("k = " + literal)["k"]
    except tomllib.TOMLDecodeError:
        return literal[1:-1]


def key_lines(text: str) -> dict[tuple, int]:
    """Key path -> line, for every key, table and array item of a valid TOML
    document: ("policy", "allow", 2) -> 9. Best effort: never raises."""
    lines: dict[tuple, int] = {}
    try:
        toks = list(_tokens(text))
    except Exception:                              # the locator must never fail a load
        return lines
    i, n = 0, len(toks)
    table: tuple = ()

    def peek(k=0):
        return toks[i + k] if i + k < n else ("eof", "", 0)

    def read_key():
        nonlocal i
        parts = []
        while i < n and toks[i][0] == "key":
            parts.append(toks[i][1])
            i += 1
            if i < n and toks[i][0] == ".":
                i += 1
            else:
                break
        return tuple(parts)

    def note(path, line):
        for k in range(1, len(path) + 1):
            lines.setdefault(path[:k], line)

    def skip_nl():
        nonlocal i
        while i < n and toks[i][0] == "nl":
            i += 1

    def value(path):
        nonlocal i
        kind, _, line = peek()
        if kind == "[":
            i += 1
            index = 0
            while i < n:
                skip_nl()
                if peek()[0] == "]":
                    i += 1
                    return
                lines.setdefault(path + (index,), peek()[2])
                value(path + (index,))
                skip_nl()
                if peek()[0] == ",":
                    i += 1
                    index += 1
                elif peek()[0] == "]":
                    i += 1
                    return
                else:
                    i += 1
            return
        if kind == "{":
            i += 1
            while i < n and peek()[0] not in ("}", "nl"):
                if peek()[0] == ",":
                    i += 1
                    continue
                key_line = peek()[2]
                key = read_key()
                if not key or peek()[0] != "=":
                    i += 1
                    continue
                i += 1
                note(path + key, key_line)
                value(path + key)
            i += 1
            return
        # A scalar: one or more tokens up to the end of the value.
        while i < n and peek()[0] not in (",", "]", "}", "nl"):
            i += 1

    try:
        while i < n:
            skip_nl()
            if i >= n:
                break
            kind, _, line = toks[i]
            if kind == "[":
                i += 1
                array_table = peek()[0] == "["
                if array_table:
                    i += 1
                table = read_key()
                note(table, line)
                while i < n and toks[i][0] != "nl":
                    i += 1
            elif kind == "key":
                key = read_key()
                if peek()[0] == "=":
                    i += 1
                    note(table + key, line)
                    value(table + key)
                while i < n and toks[i][0] != "nl":
                    i += 1
            else:
                i += 1
    except Exception:
        pass
    return lines


def line_of(lines: dict[tuple, int], path: tuple) -> int | None:
    """The most precise line known for `path`: the item, else its key, else its table."""
    for k in range(len(path), 0, -1):
        if path[:k] in lines:
            return lines[path[:k]]
    return None

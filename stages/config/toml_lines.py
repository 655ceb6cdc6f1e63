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
    try:
        toks = list(_tokens(text))
    except Exception:                              # the locator must never fail a load
        return {}
    locator = _Locator(toks)
    try:
        locator.document()
    except Exception:
        pass
    return locator.lines


class _Locator:
    """Walks the tokens once, noting the line where each key path starts."""

    def __init__(self, toks: list):
        self.toks, self.i, self.n = toks, 0, len(toks)
        self.lines: dict[tuple, int] = {}

    def peek(self, k: int = 0):
        return self.toks[self.i + k] if self.i + k < self.n else ("eof", "", 0)

    def read_key(self) -> tuple:
        parts = []
        while self.i < self.n and self.toks[self.i][0] == "key":
            parts.append(self.toks[self.i][1])
            self.i += 1
            if self.i < self.n and self.toks[self.i][0] == ".":
                self.i += 1
            else:
                break
        return tuple(parts)

    def note(self, path: tuple, line: int) -> None:
        for k in range(1, len(path) + 1):
            self.lines.setdefault(path[:k], line)

    def skip_nl(self) -> None:
        while self.i < self.n and self.toks[self.i][0] == "nl":
            self.i += 1

    def to_line_end(self) -> None:
        while self.i < self.n and self.toks[self.i][0] != "nl":
            self.i += 1

    def document(self) -> None:
        table: tuple = ()
        while self.i < self.n:
            self.skip_nl()
            if self.i >= self.n:
                break
            kind, _, line = self.toks[self.i]
            if kind == "[":
                self.i += 1
                if self.peek()[0] == "[":          # [[array of tables]]
                    self.i += 1
                table = self.read_key()
                self.note(table, line)
                self.to_line_end()
            elif kind == "key":
                key = self.read_key()
                if self.peek()[0] == "=":
                    self.i += 1
                    self.note(table + key, line)
                    self.value(table + key)
                self.to_line_end()
            else:
                self.i += 1

    def value(self, path: tuple) -> None:
        kind = self.peek()[0]
        if kind == "[":
            self.i += 1
            self.array(path)
        elif kind == "{":
            self.i += 1
            self.inline_table(path)
        else:
            # A scalar: one or more tokens up to the end of the value.
            while self.i < self.n and self.peek()[0] not in (",", "]", "}", "nl"):
                self.i += 1

    def array(self, path: tuple) -> None:
        index = 0
        while self.i < self.n:
            self.skip_nl()
            if self.peek()[0] == "]":
                self.i += 1
                return
            self.lines.setdefault(path + (index,), self.peek()[2])
            self.value(path + (index,))
            self.skip_nl()
            if self.peek()[0] == ",":
                self.i += 1
                index += 1
            elif self.peek()[0] == "]":
                self.i += 1
                return
            else:
                self.i += 1

    def inline_table(self, path: tuple) -> None:
        while self.i < self.n and self.peek()[0] not in ("}", "nl"):
            if self.peek()[0] == ",":
                self.i += 1
                continue
            key_line = self.peek()[2]
            key = self.read_key()
            if not key or self.peek()[0] != "=":
                self.i += 1
                continue
            self.i += 1
            self.note(path + key, key_line)
            self.value(path + key)
        self.i += 1


def line_of(lines: dict[tuple, int], path: tuple) -> int | None:
    """The most precise line known for `path`: the item, else its key, else its table."""
    for k in range(len(path), 0, -1):
        if path[:k] in lines:
            return lines[path[:k]]
    return None

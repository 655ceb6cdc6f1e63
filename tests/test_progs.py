"""The programs the tests run are files of tests/progs (issue 46), where a
linter reads them, not strings inside the tests: no test module holds a
program written as a string of more than five lines, and each program of
tests/progs at least compiles."""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

from progs_support import PROGS

TESTS = Path(__file__).resolve().parent
# A string's first line that reads as code: Python, shell, JavaScript, Go, Java, C.
CODE = re.compile(r"\s*(import |from \S+ import |def |class |async def |#!|#include|package |const |function "
                  r"|set -e|curl |git |mount |for .* in .*:|if __name__)")
MOST_LINES = 5          # a one-liner or a few lines may stay beside its test
# Multi-line strings that read as code but are no program the tests run.
# (the module, the string's first line)
NOT_PROGRAMS = {
    ("test_exits.py", "def f(code):"),      # what test_the_bare_number_check_finds_them parses, never runs
}


def programs_written_as_strings(path: Path) -> list[tuple[int, int, str]]:
    """(line, lines, its first line) of each string (or f-string) in `path`
    that is a program of more than MOST_LINES lines; docstrings are not."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        if isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(p.value if isinstance(p, ast.Constant) else "X" for p in node.values)
        else:
            continue
        lines = [line for line in textwrap.dedent(text).splitlines() if line.strip()]
        span = node.end_lineno - node.lineno + 1
        if len(lines) >= 3 and CODE.match(lines[0]) and span > MOST_LINES:
            found.append((node.lineno, span, lines[0].strip()))
    return found


def test_no_test_holds_a_program_written_as_a_string():
    found = [(str(path.relative_to(TESTS)), line, span) for path in sorted(TESTS.rglob("*.py"))
             if PROGS not in path.parents
             for line, span, first in programs_written_as_strings(path)
             if (str(path.relative_to(TESTS)), first) not in NOT_PROGRAMS]
    assert found == [], f"move each to tests/progs/ (file, line, lines): {found}"


def test_the_check_finds_a_program_written_as_a_string(tmp_path):
    """Control: the check sees a program as the tests used to hold them."""
    sample = tmp_path / "test_sample.py"
    sample.write_text('PROGRAM = r"""\nimport socket, sys\nhost = sys.argv[1]\n'
                      'with socket.create_connection((host, 80)) as s:\n    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")\n'
                      '    print(s.recv(100))\n"""\n\nCONFIG = """\nversion = 1\n[policy]\n'
                      'default = "deny"\nallow = ["a"]\ndeny = ["b"]\n"""\n')
    assert programs_written_as_strings(sample) == [(1, 7, "import socket, sys")]


def test_each_python_program_of_tests_progs_compiles():
    for path in sorted(PROGS.glob("*.py")):
        compile(path.read_text(), str(path), "exec")

"""vpnw's exit codes and version, each written in one place."""
from __future__ import annotations

import ast
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import stages
from stages.wire.exits import ExitCode, killed_by

STAGES = Path(stages.__file__).parent


def test_the_codes_are_design_section_5():
    assert {c.name: int(c) for c in ExitCode} == {
        "DENIED": 120, "USAGE": 121, "NO_SANDBOX": 122, "PATH_DOWN": 123, "STILL_RUNNING": 124,
        "INTERNAL": 125,
        "CANNOT_EXECUTE": 126, "NOT_FOUND": 127}
    assert killed_by(9) == 137 and killed_by(15) == 143


def _names_a_code(node) -> bool:
    text = ast.unparse(node).lower()
    return any(word in text for word in ("code", "exit", "status"))


def bare_exit_codes(source: str) -> list[str]:
    """Decimal 120-127 returned, given to an exit call or a code= keyword,
    assigned to or compared with something named like a code."""
    def code_like(node) -> bool:
        return (type(node) is ast.Constant and type(node.value) is int
                and 120 <= node.value <= 127
                and ast.get_source_segment(source, node).isdecimal())

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Return) and node.value is not None:
            suspects = [node.value, *getattr(node.value, "elts", [])]
        elif isinstance(node, ast.Call) and _names_a_code(node.func):
            suspects = [*node.args, *(k.value for k in node.keywords)]
        elif isinstance(node, ast.Call):
            suspects = [k.value for k in node.keywords if "code" in (k.arg or "")]
        elif isinstance(node, ast.Assign) and any(map(_names_a_code, node.targets)):
            suspects = [node.value]
        elif isinstance(node, ast.Compare) and _names_a_code(node.left):
            suspects = node.comparators
        else:
            continue
        if any(code_like(n) for n in suspects):
            found.append(ast.get_source_segment(source, node))
    return found


def test_no_stage_writes_an_exit_code_as_a_bare_number():
    # exits.py is the one place they are written.
    found = [(str(path.relative_to(STAGES)), hit) for path in STAGES.rglob("*.py")
             if path.name != "exits.py" for hit in bare_exit_codes(path.read_text())]
    assert found == []


def test_the_bare_number_check_finds_them():
    source = textwrap.dedent("""
        def f(code):
            if code == 125:
                return 122
            sys.exit(121)
            os._exit(127)
            exit_code = 123
            emit(code=126)
            return 120, None
            port = 127; return ord(ch) <= 126
    """)
    assert len(bare_exit_codes(source)) == 7


def test_the_version_is_the_package_metadata():
    assert importlib.metadata.version("vpnw") == stages.__version__


def test_vpnw_version_prints_it():
    vpnw = os.path.join(os.path.dirname(sys.executable), "vpnw")
    out = subprocess.run([vpnw, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"vpnw, version {stages.__version__}"

"""The house's size and naming rules for stages/ (docs/architecture.md,
"The house rules"), beside test_layout.py's folder rules. Each limit is the
point past which a reviewer could no longer hold the thing in mind at once;
each test names every offender, so a failure says what to split."""
from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from pathlib import Path

from test_layout import STAGES, _folder, import_graph

MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
STARTUP = STAGES / "startup"
# Imports inside functions: each says why on its line or the line above.
# The reasons (docs/architecture.md, "Layout"): a stage's modules load in the
# stage's own fork (broker/main.py, recorder/main.py, helper/main.py: about
# 30), the policy's and the paths' loaders after vpnw forks the helper
# (run_command.py, paths.py, policy.py: about 25), the record's modules
# (orjson) after the helper's plan (run.py's parts: about 20), a command's
# modules when it is named (cli.py's lazy table, doctor's --config) and a
# heavy or optional library where it is used (tomlkit, jsonschema,
# subprocess, hashlib's OpenSSL). 148 outside stages/startup/ when this was
# written (down from 347); the start-up package itself, whose business is
# when a module loads, is not counted. Raising the limit needs a reviewer to
# agree that the new ones are needed.
MAX_IMPORTS_INSIDE_FUNCTIONS = 150


def _modules():
    for path in sorted(STAGES.rglob("*.py")):
        yield path, path.read_text()


def _where(path: Path, node) -> str:
    return f"{path.relative_to(STAGES.parent)}:{node.lineno}"


def _defs(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_module_over_the_limit():
    over = [f"{p.relative_to(STAGES.parent)}: {text.count(chr(10))} lines"
            for p, text in _modules() if text.count("\n") > MAX_MODULE_LINES]
    assert over == []


def test_no_class_or_function_over_the_limit():
    over = []
    for path, text in _modules():
        for node in _defs(ast.parse(text)):
            lines = node.end_lineno - node.lineno + 1
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if lines > limit:
                over.append(f"{_where(path, node)} {node.name}: {lines} lines")
    assert over == []


def test_no_two_classes_share_a_name():
    homes = defaultdict(list)
    for path, text in _modules():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                homes[node.name].append(_where(path, node))
    shared = {name: where for name, where in homes.items() if len(where) > 1}
    assert shared == {}


def _writes_sys_modules(node) -> bool:
    def is_sys_modules(expr) -> bool:
        return ast.unparse(expr) in ("sys.modules", "modules")
    if isinstance(node, (ast.Assign, ast.Delete, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        return any(isinstance(t, ast.Subscript) and is_sys_modules(t.value) for t in targets)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return (is_sys_modules(node.func.value)
                and node.func.attr in ("pop", "popitem", "setdefault", "update", "clear",
                                       "__setitem__", "__delitem__"))
    return False


def test_sys_modules_is_written_only_in_the_startup_package():
    writes = [_where(path, node) for path, text in _modules()
              if STARTUP not in path.parents
              for node in ast.walk(ast.parse(text)) if _writes_sys_modules(node)]
    assert writes == []


def _imports_inside_functions(path: Path, text: str):
    tree = ast.parse(text)
    seen = set()
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in seen:
                    seen.add(node.lineno)
                    yield node


def test_each_import_inside_a_function_says_why():
    silent = []
    count = 0
    for path, text in _modules():
        lines = text.splitlines()
        for node in _imports_inside_functions(path, text):
            count += STARTUP not in path.parents
            own = lines[node.lineno - 1:node.end_lineno]
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            if not any("#" in line for line in own) and not above.startswith("#"):
                silent.append(_where(path, node))
    assert silent == [], "imports inside functions without a comment saying why"
    assert count <= MAX_IMPORTS_INSIDE_FUNCTIONS, count


def test_no_circle_between_folders():
    edges = defaultdict(set)
    for module, targets in import_graph().items():
        for target in targets:
            a, b = _folder(module), _folder(target)
            if a and b and a != b:
                edges[a].add(b)
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen
    reaches = {folder: reach(folder) for folder in list(edges)}
    circles = [f"{a} <-> {b}" for a, b in itertools.combinations(sorted(reaches), 2)
               if b in reaches[a] and a in reaches.get(b, ())]
    assert circles == []


def _c_halves_imported(tree) -> list[ast.AST]:
    """Imports of CPython's private modules (`_json`, `_socket`, ...)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name.startswith("_") and not name.startswith("__") for name in names):
            found.append(node)
    return found


def test_cpythons_private_modules_are_imported_only_in_the_startup_package():
    """A C half imported directly is a start-up trick (stages/startup/tricks.py):
    it lives in stages/startup/, where the switch turns it off."""
    outside = [_where(path, node) for path, text in _modules()
               if STARTUP not in path.parents
               for node in _c_halves_imported(ast.parse(text))]
    assert outside == []

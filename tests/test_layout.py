"""The layout docs/architecture.md draws, enforced: which folder of `stages/`
may import which, counting imports inside functions, and no import cycles."""
from __future__ import annotations

import ast
from pathlib import Path

STAGES = Path(__file__).resolve().parent.parent / "stages"

STAGE_FOLDERS = {"orchestrator", "helper", "broker", "recorder", "learner"}
SHARED_FOLDERS = {"config", "record", "wire", "kernel", "protocols"}
# The start-up tricks (docs/architecture.md, "Start-up budget"): below every
# other folder, importing none of them.
STARTUP_FOLDER = "startup"
TOOL_FOLDERS = {"inside"}      # run inside the sandbox; not stages
# What each folder may import besides itself and the shared folders.
MAY_IMPORT = {
    "orchestrator": STAGE_FOLDERS | TOOL_FOLDERS,
    "helper": set(),
    "broker": set(),
    "recorder": set(),
    "learner": set(),
    "inside": set(),
    **{shared: set() for shared in SHARED_FOLDERS},
    STARTUP_FOLDER: set(),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(STAGES.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str) -> str:
    """The module a dotted import name lands in (an attribute's module)."""
    while name:
        as_path = STAGES.parent / name.replace(".", "/")
        if as_path.with_suffix(".py").is_file() or (as_path / "__init__.py").is_file():
            return name
        name = name.rpartition(".")[0]
    return name


def import_graph() -> dict[str, set[str]]:
    """module -> the stages modules it imports anywhere (module level or in a function)."""
    graph: dict[str, set[str]] = {}
    for path in STAGES.rglob("*.py"):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                if name == "stages" or name.startswith("stages."):
                    target = _resolve(name)
                    if target and target != module:
                        targets.add(target)
    return graph


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] != "__main__") else ""


def test_stages_has_only_folders_at_the_top():
    loose = sorted(p.name for p in STAGES.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert loose == [], f"modules loose at the top of stages/: {loose}"
    folders = {p.name for p in STAGES.iterdir() if (p / "__init__.py").is_file()}
    assert folders == STAGE_FOLDERS | SHARED_FOLDERS | TOOL_FOLDERS | {STARTUP_FOLDER}


def test_each_folder_imports_only_what_the_layout_allows():
    wrong = []
    for module, targets in sorted(import_graph().items()):
        folder = _folder(module)
        if folder == "":
            continue          # stages/__init__ and __main__ (the command's entry)
        allowed = {folder, STARTUP_FOLDER} | SHARED_FOLDERS | MAY_IMPORT[folder]
        if folder in SHARED_FOLDERS:
            allowed = SHARED_FOLDERS | {STARTUP_FOLDER}
        if folder == STARTUP_FOLDER:
            allowed = {STARTUP_FOLDER}
        # `stages` itself holds only __version__.
        wrong += [f"{module} -> {t}" for t in sorted(targets)
                  if t != "stages" and _folder(t) not in allowed]
    assert wrong == [], "imports the layout forbids:\n" + "\n".join(wrong)


def test_no_import_cycles_counting_imports_inside_functions():
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:      # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    assert cycles == [], f"import cycles: {cycles}"

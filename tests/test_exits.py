"""vpnw's exit codes and version, each written in one place."""
from __future__ import annotations

import ast
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import stages
from stages.exits import ExitCode, killed_by

STAGES = Path(stages.__file__).parent


def test_the_codes_are_design_section_5():
    assert {c.name: int(c) for c in ExitCode} == {
        "DENIED": 120, "USAGE": 121, "NO_SANDBOX": 122, "PATH_DOWN": 123, "INTERNAL": 125,
        "CANNOT_EXECUTE": 126, "NOT_FOUND": 127}
    assert killed_by(9) == 137 and killed_by(15) == 143


def test_no_stage_writes_an_exit_code_as_a_bare_number():
    # exits.py is the one place. The decimal integers 120-127 that are not exit codes:
    not_exit_codes = {("addresses.py", "int(ip) >> 125"),            # 2000::/3 is the top 3 bits
                      ("addresses.py", "int(ip) >> 125 != 0b001"),
                      ("helper/netlink.py", "r.dst[0] == 127")}     # 127.0.0.0/8
    found = []
    for path in STAGES.rglob("*.py"):
        if path.name == "exits.py":
            continue
        source = path.read_text()

        def exit_code_like(node):
            return (type(node) is ast.Constant and type(node.value) is int
                    and 120 <= node.value <= 127
                    and ast.get_source_segment(source, node).isdecimal())

        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare | ast.BinOp):
                inside = ast.walk(node)
            elif isinstance(node, ast.Return | ast.Assign | ast.keyword | ast.Call):
                inside = ast.iter_child_nodes(node)
            else:
                continue
            if any(exit_code_like(n) for n in inside):
                where = (str(path.relative_to(STAGES)), ast.get_source_segment(source, node))
                if where not in not_exit_codes:
                    found.append(where)
    assert found == []


def test_the_version_is_the_package_metadata():
    assert importlib.metadata.version("vpnw") == stages.__version__


def test_vpnw_version_prints_it():
    vpnw = os.path.join(os.path.dirname(sys.executable), "vpnw")
    out = subprocess.run([vpnw, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"vpnw, version {stages.__version__}"

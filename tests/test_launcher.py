"""vpnw's launcher (bin/vpnw, installed as a script, not an entry point):
it imports nothing before vpnw's entry point. The console script pip writes
for an entry point imports `re` first, about 6 ms before the helper's fork
(docs/architecture.md, "Start-up budget"). Control: vpnw-ssh-proxy, still an
entry point, shows the check sees that `re`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent


def _imported_before(script: Path, args: list[str], module: str) -> list[str]:
    """The modules whose import ended before `module`'s did, when the installed
    `script` runs (python -X importtime lists each import as it ends; a
    package's own line comes after its submodules')."""
    r = subprocess.run([sys.executable, "-I", "-X", "importtime", str(script), *args],
                       capture_output=True, text=True, cwd="/", timeout=60)
    names = [line.split("|")[-1].strip() for line in r.stderr.splitlines()
             if line.startswith("import time:") and "|" in line]
    assert module in names, r.stderr[-2000:]
    return names[:names.index(module)]


def _python_of(script: Path) -> str:
    return script.read_text().splitlines()[0]


def test_the_installed_vpnw_imports_nothing_before_its_entry_point():
    vpnw = BIN / "vpnw"
    assert _python_of(vpnw).startswith(f"#!{BIN}/python")      # pip made "#!python" ours
    before = _imported_before(vpnw, ["--version"], "stages.orchestrator.main")
    assert "re" not in before
    assert "signal" in before          # control: main.py's own imports are listed


def test_the_control_an_entry_points_script_imports_re_first():
    proxy = BIN / "vpnw-ssh-proxy"
    if not proxy.exists():
        pytest.skip("no vpnw-ssh-proxy beside the test interpreter")
    # Before the `stages` package itself (its relay's modules import re later).
    assert "re" in _imported_before(proxy, ["--help"], "stages")


def test_the_launcher_is_a_script_of_the_project_not_an_entry_point():
    """pyproject names bin/vpnw as the script (what pip, pipx and uv install as
    `vpnw`), and no entry point also called vpnw would overwrite it."""
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["script-files"] == ["bin/vpnw"]
    assert "vpnw" not in project["project"]["scripts"]
    source = (ROOT / "bin" / "vpnw").read_text()
    assert source.startswith("#!python\n")
    code = [line for line in source.splitlines()[1:] if line and not line.startswith("#")]
    assert code == ["import sys", "from stages.orchestrator.main import main", "sys.exit(main())"]

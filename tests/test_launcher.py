"""vpnw's launcher (bin/vpnw, installed as a script, not an entry point):
it imports nothing before vpnw's entry point. The console script pip writes
for an entry point imports `re` first, about 6 ms before the helper's fork
(docs/architecture.md, "Start-up budget"). Control: vpnw-ssh-proxy, still an
entry point, shows the check sees that `re`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci_support import cannot
from startup_support import needs_the_tricks

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


@needs_the_tricks      # with them off main.py goes through click, which loads re
def test_the_installed_vpnw_imports_nothing_before_its_entry_point():
    vpnw = BIN / "vpnw"
    assert _python_of(vpnw).startswith(f"#!{BIN}/python")      # pip made "#!python" ours
    before = _imported_before(vpnw, ["--version"], "stages.orchestrator.main")
    assert "re" not in before
    assert "signal" in before          # control: main.py's own imports are listed


def test_the_control_an_entry_points_script_imports_re_first():
    proxy = BIN / "vpnw-ssh-proxy"
    if not proxy.exists():
        cannot("no vpnw-ssh-proxy beside the test interpreter (pyproject's project.scripts installs it)")
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
    code = [line for line in source.splitlines()[1:] if line and not line.lstrip().startswith("#")]
    assert code[0] == "import sys"
    assert code[-2:] == ["from stages.orchestrator.main import main", "sys.exit(main())"]
    # between them only the -S branch (its own tests below): no other import before main
    assert all(line.startswith(" ") or line.startswith("if sys.flags.no_site") for line in code[1:-2])


# -- -IS: the launcher plays site's part for its venv (scripts/setup) ----------

def _shebang(script: Path) -> list[str]:
    return _python_of(script)[2:].split()


def _imports(argv: list[str], **kw) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run argv (an interpreter, its flags, then the rest) with -X importtime:
    the process's result and the names of every module it imported."""
    r = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True,
                       cwd="/", timeout=60, **kw)
    return r, [line.split("|")[-1].strip() for line in r.stderr.splitlines()
               if line.startswith("import time:") and "|" in line]


SITE_MODULES = {"site", "sitecustomize", "_distutils_hack", "_sitebuiltins"}


def test_setup_runs_the_launcher_without_site_and_it_imports_none():
    vpnw = BIN / "vpnw"
    assert _shebang(vpnw) == [f"{BIN}/python", "-IS"]          # scripts/setup's
    r, names = _imports([*_shebang(vpnw), str(vpnw), "--version"])
    assert r.returncode == 0 and "vpnw, version" in r.stdout, r.stderr[-2000:]
    assert "stages.orchestrator.main" in names
    assert not SITE_MODULES & set(names)
    # control: the same launcher on the same interpreter with site (-I) imports them
    r, names = _imports([f"{BIN}/python", "-I", str(vpnw), "--version"])
    assert r.returncode == 0
    assert {"site", "_distutils_hack"} <= set(names)


def _venv_beside(tmp_path: Path, *, site_packages: bool, cfg: bool = True) -> Path:
    """A venv's layout whose interpreter is this one's base: pyvenv.cfg (unless
    not `cfg`) and, with `site_packages`, this venv's site-packages linked in.
    Returns its launcher, a copy of the installed one, run with -IS."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys._base_executable, venv / "bin" / "python")
    if cfg:
        (venv / "pyvenv.cfg").write_text((BIN.parent / "pyvenv.cfg").read_text())
    lib = venv / "lib" / ("python%d.%d" % sys.version_info[:2])
    lib.mkdir(parents=True)
    if site_packages:
        os.symlink(BIN.parent / "lib" / lib.name / "site-packages", lib / "site-packages")
    launcher = venv / "bin" / "vpnw"
    body = (BIN / "vpnw").read_text().split("\n", 1)[1]
    launcher.write_text(f"#!{venv}/bin/python -IS\n{body}")
    launcher.chmod(0o755)
    return launcher


def test_the_launcher_finds_its_modules_from_its_interpreters_venv(tmp_path):
    """The site-packages it puts on the path is the one of the venv above its
    interpreter, not this test's: linked in, a run of `--version` works."""
    launcher = _venv_beside(tmp_path, site_packages=True)
    r = subprocess.run([str(launcher), "--version"], capture_output=True, text=True, cwd="/",
                       timeout=60)
    assert r.returncode == 0 and "vpnw, version" in r.stdout, r.stderr


@pytest.mark.parametrize("cfg", [True, False], ids=["no site-packages", "no pyvenv.cfg"])
def test_a_launcher_whose_modules_are_not_there_fails_closed_and_says_so(tmp_path, cfg):
    launcher = _venv_beside(tmp_path, site_packages=not cfg, cfg=cfg)
    packages = launcher.parent.parent / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages"
    marker = tmp_path / "ran"
    r = subprocess.run([str(launcher), "run", "--record", "-", "--", "touch", str(marker)],
                       capture_output=True, text=True, cwd="/", timeout=60)
    assert r.returncode == 125, r
    assert r.stderr == (f"vpnw: its modules are not in {packages}, the site-packages of the venv "
                        f"of its interpreter {launcher.parent}/python; install vpnw again "
                        f"(scripts/setup)\n")
    assert r.stdout == "" and not marker.exists()


@pytest.mark.world
def test_a_run_without_site_runs_and_protects_the_whole_venv(world, user):
    """As root and as vpnwtest, the installed launcher as its shebang runs it
    (-IS) loads no `site` in any process of a run, and the run works: exit 0,
    a run.start whose read-only installation is the venv's whole prefix
    (pyvenv.cfg names the interpreter: the launcher sets sys.prefix as site
    would), not only its site-packages."""
    work = world.workdir(user)
    record = work / "no-site.jsonl"
    vpnw = world.vpnw_path
    python, flags = _shebang(vpnw)
    result = world.run([python, flags, "-X", "importtime", str(vpnw), "run", "--record", str(record),
                        "--", "true"], user=user)
    assert result.returncode == 0, result.stderr[-3000:]
    names = {line.split("|")[-1].strip() for line in result.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    assert "stages.orchestrator.main" in names and not SITE_MODULES & names
    start = json.loads(record.read_text().splitlines()[0])
    assert start["type"] == "run.start"
    read_only = start["fields"]["protected"]["read_only"]
    assert str(BIN.parent) in read_only, read_only

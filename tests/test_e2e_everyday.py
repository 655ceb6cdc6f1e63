"""Everyday tools through vpnw with no flags, in the test world, as root and as
an unprivileged user: npm from a registry the world serves, a JVM HTTP client
and a JVM plain socket, plain ssh and scp with the documented ProxyCommand,
the hint line for a program that ignores the proxy, and the daily-use install
from a fresh clone."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from ci_support import cannot as _cannot
from e2e_support import describe, opened, run_events
from progs_support import prog_text
from world import DEFAULT_NAMES, _check

pytestmark = pytest.mark.world
ROOT = Path(__file__).resolve().parent.parent
NPM_PACKAGE = "vpnw-world-pkg"
NPM_VALUE = "hello from the world's npm registry"
HINT = "vpnw: hint: the program exited"
GITHUB = DEFAULT_NAMES["api.github.com"][0]




# ── npm ──────────────────────────────────────────────────────────────────────

@pytest.fixture(scope="module")
def npm_registry(world):
    """A static npm registry under https://pypi.world/npm/: the package
    document at /npm/<name>, the tarball under /npm-files/."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        _cannot("npm and node are needed for the npm test (scripts/setup installs nodejs)")
    files = {"package/package.json": json.dumps({"name": NPM_PACKAGE, "version": "1.0.0",
                                                 "main": "index.js"}).encode(),
             "package/index.js": f"module.exports = {{ value: {NPM_VALUE!r} }};\n".encode()}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tgz = raw.getvalue()
    # exist_ok: pytest-xdist may set this module up twice on one worker.
    (world.docroot / "npm-files").mkdir(exist_ok=True)
    (world.docroot / "npm-files" / f"{NPM_PACKAGE}-1.0.0.tgz").write_bytes(tgz)
    (world.docroot / "npm").mkdir(exist_ok=True)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
    document = {"name": NPM_PACKAGE, "dist-tags": {"latest": "1.0.0"},
                "versions": {"1.0.0": {"name": NPM_PACKAGE, "version": "1.0.0", "main": "index.js",
                                       "dist": {"tarball": f"https://pypi.world/npm-files/{NPM_PACKAGE}-1.0.0.tgz",
                                                "shasum": hashlib.sha1(tgz).hexdigest(),
                                                "integrity": integrity}}}}
    (world.docroot / "npm" / NPM_PACKAGE).write_text(json.dumps(document))
    for path in [world.docroot / "npm", world.docroot / "npm-files", *world.docroot.glob("npm*/*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return "https://pypi.world/npm/"


@pytest.mark.readme_table          # the README's client table
def test_npm_install_from_the_worlds_registry(world, user, npm_registry):
    work = world.workdir(user)
    # The project's .npmrc names a proxy the sandbox cannot reach (as a
    # company's might): vpnw's npm_config_https_proxy must win over it.
    (work / ".npmrc").write_text("proxy=http://192.0.2.1:3128\nhttps-proxy=http://192.0.2.1:3128\n")
    os.chmod(work / ".npmrc", 0o644)
    script = (f"npm install --no-audit --no-fund --loglevel=error {NPM_PACKAGE} && "
              f"node -e \"console.log(require('{NPM_PACKAGE}').value)\"")
    r = world.vpnw(["run", "--", "sh", "-c", script], user=user, cwd=work, timeout=180,
                   env={"npm_config_registry": npm_registry, "npm_config_cafile": str(world.ca_pem),
                        "npm_config_cache": str(work / ".npm-cache"), "npm_config_update_notifier": "false"})
    assert r.returncode == 0, describe(r)
    assert r.stdout.strip().splitlines()[-1] == NPM_VALUE
    conns = opened(run_events(r))
    assert conns and set(conns) == {("pypi.world", 443, "http-connect")}, conns
    fetched = [line for line in world.web_log() if "/npm" in line]
    assert any(f"/npm/{NPM_PACKAGE}" in line for line in fetched), fetched
    assert any(f"/npm-files/{NPM_PACKAGE}-1.0.0.tgz" in line for line in fetched), fetched


@pytest.mark.readme_table          # the README's client table
def test_npm_config_of_the_user_is_kept(world, user, npm_registry):
    # A user's own npm_config_https_proxy wins (here one the sandbox cannot
    # reach, so npm fails), and the record names it.
    work = world.workdir(user)
    r = world.vpnw(["run", "--", "npm", "install", "--no-audit", "--no-fund", "--fetch-retries=0",
                    NPM_PACKAGE], user=user, cwd=work, timeout=180,
                   env={"npm_config_registry": npm_registry, "npm_config_cafile": str(world.ca_pem),
                        "npm_config_cache": str(work / ".npm-cache"), "npm_config_update_notifier": "false",
                        "npm_config_https_proxy": "http://192.0.2.1:3128"})
    assert r.returncode != 0, describe(r)
    events = run_events(r)
    assert events[0]["fields"]["env_kept"] == ["npm_config_https_proxy"]
    assert opened(events) == []


# ── the JVM ──────────────────────────────────────────────────────────────────

JAVA_PROGRAM = prog_text("Fetch.java")


@pytest.fixture(scope="module")
def java_trust(world):
    if shutil.which("java") is None or shutil.which("keytool") is None:
        _cannot("java is needed for the JVM test (scripts/setup installs default-jdk-headless)")
    store = world.tmp / "files" / "world-ca.p12"
    if store.exists():
        return store
    store.parent.mkdir(parents=True, exist_ok=True)
    _check(["keytool", "-importcert", "-noprompt", "-alias", "world", "-file", str(world.ca_pem),
            "-keystore", str(store), "-storetype", "PKCS12", "-storepass", "changeit"])
    store.chmod(0o644)
    return store


@pytest.mark.readme_table          # the README's client table
def test_java_fetches_through_the_doors_with_no_proxy_flags(world, user, java_trust):
    program = world.file("Fetch.java", JAVA_PROGRAM)
    # The user's own JVM options (a trust store) stay; vpnw adds the proxy ones after them.
    mine = f"-Djavax.net.ssl.trustStore={java_trust} -Djavax.net.ssl.trustStorePassword=changeit"
    r = world.vpnw(["run", "--", "java", str(program)], user=user, timeout=180,
                   env={"JAVA_TOOL_OPTIONS": mine})
    assert r.returncode == 0, describe(r)
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [(s["host"], s["tls"]) for s in lines] == [("api.github.com", False), ("api.github.com", True),
                                                     ("pypi.world", False)], r.stdout
    assert "Picked up JAVA_TOOL_OPTIONS" in r.stderr and "proxyHost=127.0.0.1" in r.stderr
    events = run_events(r)
    assert events[0]["fields"]["env_kept"] == []
    assert opened(events) == [("api.github.com", 80, "http-forward"), ("api.github.com", 443, "http-connect"),
                              ("pypi.world", 80, "socks5")]


# ── the hint line ────────────────────────────────────────────────────────────

def test_a_failing_program_that_never_used_the_doors_gets_one_hint(world, user):
    # An address, not a name: the sandbox has no resolver either (that is curl's exit 6).
    direct = ["curl", "-sS", "--max-time", "20", "--noproxy", "*", f"http://{GITHUB}/whoami"]
    for mode in ("run", "trace"):
        r = world.vpnw([mode, "--", *direct], user=user)
        assert r.returncode == 7, describe(r)     # curl: could not connect (no route)
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith(HINT) and "README" in last, describe(r)
        assert r.stderr.count("hint:") == 1
        assert run_events(r)[-1]["fields"]["connections"] == 0
    # A program that failed after using a door, or that succeeded: no hint.
    r = world.vpnw(["run", "--", "sh", "-c", "curl -sS --max-time 20 http://api.github.com/whoami; exit 3"],
                   user=user)
    assert r.returncode == 3 and "hint:" not in r.stderr, describe(r)
    r = world.vpnw(["run", "--", "curl", "-sS", "--max-time", "20", "http://api.github.com/whoami"], user=user)
    assert r.returncode == 0 and "hint:" not in r.stderr, describe(r)


# ── doctor ───────────────────────────────────────────────────────────────────

def test_doctor_lists_the_variables_vpnw_sets(world, user):
    r = world.vpnw(["doctor"], user=user)
    assert r.returncode == 0, describe(r)
    for line in ("HTTPS_PROXY=http://127.0.0.1:3128", "ALL_PROXY=http://127.0.0.1:3128",
                 "npm_config_https_proxy=http://127.0.0.1:3128", "CARGO_HTTP_PROXY=http://127.0.0.1:3128",
                 f"GIT_SSH_COMMAND=ssh -o 'ProxyCommand={sys.executable} -I -m stages.inside.ssh_proxy %h %p'"):
        assert line in r.stdout, describe(r)
    j = world.vpnw(["doctor", "--json"], user=user)
    checks = {c["name"]: c for c in map(json.loads, j.stdout.splitlines())}
    assert checks["program_env"]["variables"]["JAVA_TOOL_OPTIONS"].startswith("-Dhttp.proxyHost=127.0.0.1")
    assert checks["program_env"]["status"] == "ok"
    # A setting of the user's own that vpnw would keep is pointed out (a warning: guard still works).
    mine = world.vpnw(["doctor", "--json"], user=user, env={"GIT_SSH_COMMAND": "ssh -i deploy"})
    assert mine.returncode == 0, describe(mine)
    checks = {c["name"]: c for c in map(json.loads, mine.stdout.splitlines())}
    assert checks["program_env"]["status"] == "warn"
    assert "GIT_SSH_COMMAND" in checks["program_env"]["detail"]
    assert "ssh -i deploy" not in mine.stdout


# ── the daily-use install ────────────────────────────────────────────────────

def _documented_install_lines(block: int = 0) -> list[str]:
    """The README's "Install for daily use" commands (its `block`th sh block:
    0 the venv, 1 pipx or uv), but for the clone itself."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Install for daily use"):]
    section = section[:section.index("\n## ", 1)]
    block_text = section.split("```sh\n")[1 + block]
    lines = block_text[:block_text.index("```")].splitlines()
    if block == 0:
        assert lines[0].startswith("git clone "), lines
        return lines[1:]
    return lines


def _wheelhouse() -> Path:
    wheelhouse = Path(sys.executable).parent.parent / "wheelhouse"
    if not any(wheelhouse.glob("pyseccomp-*.whl")):
        _cannot(f"no run-time wheels in {wheelhouse}: scripts/setup makes them")
    return wheelhouse


def _root_owned_clone(world) -> Path:
    """A clone of this checkout (HEAD) in a directory of root's, readable by
    all: a user cannot write it. Returns the directory holding `vpnw`."""
    if not (ROOT / ".git").exists():
        _cannot(f"{ROOT} is not a git checkout")
    bundle = world.tmp / "files" / "vpnw.bundle"
    if not bundle.exists():
        bundle.parent.mkdir(parents=True, exist_ok=True)
        _check(["git", "-C", str(ROOT), "bundle", "create", "-q", str(bundle), "HEAD"])
        bundle.chmod(0o644)
    where = world.workdir("root")              # root's, readable by all: the user cannot write it
    world.run(["git", "clone", "-q", str(bundle), "vpnw"], cwd=where, check=True)
    return where


def _clone_is_clean(world, where: Path) -> None:
    status = world.run(["git", "-C", str(where / "vpnw"), "status", "--porcelain", "--ignored"])
    assert status.returncode == 0 and status.stdout == "", describe(status)


def _installed_vpnw_runs(world, user: str, home: Path, env: dict, python_under: Path) -> None:
    """`vpnw run` through the installed command: curl through the door, and
    the ssh relay on the python of the venv the install made."""
    r = world.run(["sh", "-c", "vpnw run -- sh -c 'echo \"$GIT_SSH_COMMAND\"; "
                               "curl -sS --max-time 20 http://api.github.com/whoami'"],
                  user=user, cwd=home, env=env, timeout=120)
    assert r.returncode == 0, describe(r)
    lines = r.stdout.strip().splitlines()
    assert lines[-2].startswith(f"ssh -o 'ProxyCommand={python_under}/"), r.stdout
    assert lines[-2].endswith(" -I -m stages.inside.ssh_proxy %h %p'"), r.stdout
    assert json.loads(lines[-1])["host"] == "api.github.com"
    assert opened(run_events(r)) == [("api.github.com", 80, "http-forward")]


@pytest.mark.timeout(600)   # pip builds vpnw: the install is allowed 300 s
def test_daily_use_install_from_a_fresh_clone(world, user):
    """README "Install for daily use", as written, as `user`, from a clone
    owned by root that the user cannot write; pip with no index (the wheels
    vpnw needs come from the wheelhouse scripts/setup made, through pip's own
    environment variables); then `vpnw run` through the installed command."""
    wheelhouse = _wheelhouse()
    where = _root_owned_clone(world)
    home = world.workdir(user)                 # a new user's home
    env = {"HOME": str(home), "PATH": f"{home}/.local/bin:/usr/local/bin:/usr/bin:/bin",
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    r = world.run(["sh", "-ec", "\n".join(_documented_install_lines())], user=user, cwd=where,
                  env=env, timeout=300)
    assert r.returncode == 0, describe(r)
    assert "ok    program_env" in r.stdout and "deprecated" not in r.stderr, describe(r)
    venv = home / ".local" / "share" / "vpnw-venv"
    assert (home / ".local" / "bin" / "vpnw").resolve() == (venv / "bin" / "vpnw").resolve()
    _clone_is_clean(world, where)              # nothing was written into the clone
    _installed_vpnw_runs(world, user, home, env, python_under=venv / "bin")


# Each tool from PyPI (the test extra), offline: the wheels vpnw needs, and
# setuptools to build it, come from the wheelhouse scripts/setup made.
TOOL_ENV = {
    "pipx": lambda wheelhouse: {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse),
                                "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                                "PIPX_DEFAULT_PYTHON": "/usr/bin/python3", "USE_EMOJI": "0",
                                # pipx takes uv when it finds one (the test venv has it):
                                # pip, as Debian's pipx and PyPI's without uv do
                                "PIPX_DEFAULT_BACKEND": "pip"},
    "uv": lambda wheelhouse: {"UV_OFFLINE": "1", "UV_FIND_LINKS": str(wheelhouse),
                              "UV_PYTHON": "/usr/bin/python3", "UV_PYTHON_DOWNLOADS": "never",
                              "UV_NO_PROGRESS": "1"},
}


@pytest.mark.timeout(600)   # pipx or uv builds vpnw: the install is allowed 300 s
@pytest.mark.parametrize("tool", ["pipx", "uv"])
def test_daily_use_install_with_pipx_or_uv(world, user, tool):
    """The README's pipx / uv lines, as written (uv's from the comment), as
    `user`, from a root-owned clone; each tool as PyPI ships it, nothing on
    PATH but it and the system's; then `vpnw run` through what it installed."""
    exe = Path(sys.executable).parent / tool
    if not exe.exists():
        _cannot(f"{tool} is not in {exe.parent} (pyproject's test extra installs it)")
    wheelhouse = _wheelhouse()
    lines = _documented_install_lines(block=1)
    install = next(i for i, line in enumerate(lines) if line.startswith("pipx install "))
    assert 'pipx install "$src"' in lines[install] and '# or: uv tool install "$src"' in lines[install]
    if tool == "uv":
        lines[install] = 'uv tool install "$src"'
    where = _root_owned_clone(world)
    home = world.workdir(user)
    tools = world.workdir("root")              # only the tool, not the test venv's vpnw
    (tools / tool).symlink_to(exe)
    env = {"HOME": str(home), "PATH": f"{home}/.local/bin:{tools}:/usr/local/bin:/usr/bin:/bin",
           **TOOL_ENV[tool](wheelhouse)}
    r = world.run(["sh", "-ec", "\n".join(lines)], user=user, cwd=where, env=env, timeout=300)
    assert r.returncode == 0, describe(r)
    assert "ok    program_env" in r.stdout and "deprecated" not in r.stderr, describe(r)
    for script in ("vpnw", "vpnw-ssh-proxy"):
        installed = home / ".local" / "bin" / script
        assert installed.exists(), describe(r)
    venv = Path(os.path.realpath(home / ".local" / "bin" / "vpnw")).parent
    assert str(venv).startswith(str(home / ".local" / "share")), venv
    _clone_is_clean(world, where)
    _installed_vpnw_runs(world, user, home, env, python_under=venv)

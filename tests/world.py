"""The test world (docs/architecture.md, "The test world"): a fake internet inside namespaces we make.

    world namespace (net + mount)              internet namespace (net)
    ───────────────────────────               ──────────────────────────
    vpnw and its clients run here              answers for ANY address:
    vw0 10.200.0.1/30, fd00:200::1/64  ─veth─  vi0 10.200.0.2/30, fd00:200::2/64
    default routes (v4, v6) -> vi0             local 0.0.0.0/0 and ::/0 on lo
    /etc/resolv.conf -> 10.53.0.53             dnsmasq on 10.53.0.53 (logs queries)
    /etc/hosts: localhost only                 HTTP :80 :8080, HTTPS :443 (test CA)

Nothing leaves: the world is a fresh network namespace holding only what is
added here, and everything it routes goes to the internet namespace, which
delivers every packet locally. Both namespaces are unnamed and held by one
`sleep` process each; killing those (and the servers) removes them.

Needs root (to create the namespaces and to run as another user). Clients can
run as root or as the unprivileged user `vpnwtest` (created by scripts/test).
"""
from __future__ import annotations

import hashlib
import ipaddress
import importlib.util
import json
import os
import pwd
import re
import shutil
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
import base64
from pathlib import Path
from typing import Iterable, Sequence

HERE = Path(__file__).resolve().parent
SERVERS = HERE / "world_servers"

WORLD_V4, INTERNET_V4 = "10.200.0.1", "10.200.0.2"
WORLD_V6, INTERNET_V6 = "fd00:200::1", "fd00:200::2"
DNS_ADDR = "10.53.0.53"
UNPRIVILEGED_USER = "vpnwtest"
# Carried into the world's clean environment (stages/startup/__init__.py).
STARTUP_TRICKS = "VPNW_STARTUP_TRICKS"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The world's names. Addresses look public on purpose (so deny_private lets
# them through); they exist only inside our namespaces.
DEFAULT_NAMES: dict[str, list[str]] = {
    "api.github.com": ["140.82.112.6"],
    "github.com": ["140.82.112.3"],
    "files.pythonhosted.org": ["151.101.0.223"],
    "pypi.world": ["151.101.64.223"],
    "git.world": ["140.82.113.4"],
    "dual.world": ["140.82.112.7", "2606:50c0:8000::154"],
    "v6only.world": ["2606:50c0:8001::154"],
    "evil.example": ["203.0.113.66"],
    "metadata.world": ["169.254.169.254"],
}
CERT_NAMES = sorted(set(DEFAULT_NAMES) | {"*.world", "*.example", "*.github.com",
                                          "*.pythonhosted.org", "localhost",
                                          # the demo's package index (scripts/demo_world.py)
                                          "pypi.org",
                                          # the agents' own services (tests/test_agents.py)
                                          "*.anthropic.com", "*.claude.com", "chatgpt.com",
                                          "*.chatgpt.com", "*.openai.com",
                                          "*.githubusercontent.com", "*.googleapis.com",
                                          "opencode.ai", "*.opencode.ai", "registry.npmjs.org"})

DEMO_PACKAGE = "vpnw-demo-pkg"
DEMO_VERSION = "1.0"
DEMO_VALUE = "hello from the world"
GIT_README = "a repository served by the test world\n"

# Names the world itself looks up to learn that dnsmasq's log is complete.
_SYNC_SUFFIX = ".vpnw-sync.invalid"
_QUERY_RE = re.compile(r"query\[(\w+)\] (\S+) from (\S+)")


def _load_content():
    spec = importlib.util.spec_from_file_location("world_content", SERVERS / "content.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


content = _load_content()
payload = content.payload
payload_chunks = content.payload_chunks
payload_sha256 = content.payload_sha256


class WorldError(RuntimeError):
    pass


class WorldResult(subprocess.CompletedProcess):
    """A finished command in the world, plus where its vpnw state went."""

    state_home: Path

    def run_files(self) -> list[Path]:
        runs = self.state_home / "vpnw" / "runs"
        return sorted(runs.glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns) if runs.is_dir() else []

    def events(self) -> list[dict]:
        """Every event of the newest run file, each line parsed strictly."""
        files = self.run_files()
        if not files:
            raise WorldError(f"no run file under {self.state_home}")
        lines = files[-1].read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _check(argv: Sequence[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise WorldError(f"{' '.join(argv)} -> {proc.returncode}: {proc.stderr.strip()}")
    return proc


def private_binds(binds: dict) -> list[str]:
    """The argv prefix (run as root in the world) that gives what follows a
    mount namespace of its own with each {target: source} bound over its
    target. Private: nothing mounted there reaches the world's namespace,
    so no other test, on this worker or later, ever sees it (tests that
    mounted over shared paths such as the passwd homes in the world itself
    leaked into each other under pytest-xdist)."""
    if not binds:
        return []
    script = " && ".join(f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))}"
                         for target, source in binds.items())
    return ["unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", f'{script} && exec "$@"', "private-binds"]


class World:
    def __init__(self) -> None:
        self.tmp: Path | None = None
        self.world_pid: int | None = None
        self.internet_pid: int | None = None
        self._started: list[subprocess.Popen] = []
        self._dnsmasq: subprocess.Popen | None = None
        self._names: dict[str, list[str]] = {}
        self._state_counter = 0
        self.ca_pem: Path | None = None
        self.vpnw_path = Path(sys.executable).parent / "vpnw"
        self.python = sys.executable

    # ── building ─────────────────────────────────────────────────────────
    def start(self) -> "World":
        if os.geteuid() != 0:
            raise WorldError("the test world needs root")
        for tool in ("unshare", "nsenter", "ip", "setpriv", "dnsmasq", "git"):
            if shutil.which(tool) is None:
                raise WorldError(f"the test world needs {tool!r}")
        try:
            self.tmp = Path(tempfile.mkdtemp(prefix="vpnw-world-"))
            self.tmp.chmod(0o755)
            self._make_namespaces()
            self._make_network()
            self._make_files()
            self._start_dns()
            self._start_web()
        except BaseException:
            self.stop()
            raise
        return self

    def _hold(self, *flags: str) -> int:
        # A `sleep` holds each unnamed namespace; nothing to clean up in /run/netns.
        proc = subprocess.Popen(["unshare", *flags, "--", "sleep", "infinity"],
                                stdin=subprocess.DEVNULL)
        self._started.append(proc)
        # unshare execs sleep once the namespaces exist; wait for that.
        own = os.readlink("/proc/self/ns/net")
        for _ in range(2000):
            try:
                if (os.readlink(f"/proc/{proc.pid}/ns/net") != own
                        and Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep"):
                    return proc.pid
            except FileNotFoundError:
                break
            time.sleep(0.005)
        raise WorldError(f"unshare {' '.join(flags)} did not start")

    def _make_namespaces(self) -> None:
        self.world_pid = self._hold("--net", "--mount", "--propagation", "private")
        self.internet_pid = self._hold("--net")

    def in_world(self, *argv: str) -> subprocess.CompletedProcess:
        return _check(["nsenter", "-t", str(self.world_pid), "-n", "-m", "--", *argv])

    def in_internet(self, *argv: str) -> subprocess.CompletedProcess:
        return _check(["nsenter", "-t", str(self.internet_pid), "-n", "--", *argv])

    def _make_network(self) -> None:
        w, i = self.in_world, self.in_internet
        w("ip", "link", "set", "lo", "up")
        i("ip", "link", "set", "lo", "up")
        # Created inside the world, its peer moved straight to the internet:
        # the pair never appears in the host's namespace.
        w("ip", "link", "add", "vw0", "type", "veth", "peer", "name", "vi0",
          "netns", str(self.internet_pid))
        w("ip", "addr", "add", f"{WORLD_V4}/30", "dev", "vw0")
        w("ip", "-6", "addr", "add", f"{WORLD_V6}/64", "dev", "vw0", "nodad")
        w("ip", "link", "set", "vw0", "up")
        w("ip", "route", "add", "default", "via", INTERNET_V4, "dev", "vw0")
        w("ip", "-6", "route", "add", "default", "via", INTERNET_V6, "dev", "vw0")
        i("ip", "addr", "add", f"{INTERNET_V4}/30", "dev", "vi0")
        i("ip", "-6", "addr", "add", f"{INTERNET_V6}/64", "dev", "vi0", "nodad")
        i("ip", "addr", "add", f"{DNS_ADDR}/32", "dev", "lo")
        i("ip", "link", "set", "vi0", "up")
        # The internet answers for every address: a local default route. The
        # world's own addresses (and link-local, for neighbour discovery) are
        # looked up in main first, so replies still go back over the veth.
        i("ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "local")
        i("ip", "-6", "route", "add", "local", "::/0", "dev", "lo", "table", "local")
        i("ip", "rule", "add", "pref", "100", "to", f"{WORLD_V4}/32", "lookup", "main")
        i("ip", "-6", "rule", "add", "pref", "100", "to", f"{WORLD_V6}/128", "lookup", "main")
        i("ip", "-6", "rule", "add", "pref", "101", "to", "fe80::/10", "lookup", "main")
        for family in ("-4", "-6"):
            i("ip", family, "rule", "add", "pref", "200", "lookup", "local")
            i("ip", family, "rule", "del", "pref", "0", "lookup", "local")

    def _make_files(self) -> None:
        etc = self.tmp / "etc"
        etc.mkdir()
        (etc / "resolv.conf").write_text(f"nameserver {DNS_ADDR}\n")
        (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
        for name in ("resolv.conf", "hosts"):
            (etc / name).chmod(0o644)
            self.in_world("mount", "--bind", str(etc / name), f"/etc/{name}")
        self._make_certs()
        self.docroot = self.tmp / "www"
        self.docroot.mkdir()
        self._make_package_index()
        self._make_git_repo()
        for path in [self.tmp, *self.tmp.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        for user in ("root", UNPRIVILEGED_USER):
            if user_exists(user):
                self._home(user)

    def _make_certs(self) -> None:
        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert(*CERT_NAMES)
        self.ca_pem = self.tmp / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_pem))
        self.ca_pem.chmod(0o644)
        private = self.tmp / "server"
        private.mkdir(mode=0o700)
        self._server_cert = private / "server.pem"
        self._server_key = private / "server.key"
        cert.private_key_pem.write_to_path(str(self._server_key))
        with open(self._server_cert, "wb") as f:
            for blob in cert.cert_chain_pems:
                f.write(blob.bytes())

    def _make_package_index(self) -> None:
        dist = DEMO_PACKAGE.replace("-", "_")
        wheel_name = f"{dist}-{DEMO_VERSION}-py3-none-any.whl"
        files = {
            f"{dist}/__init__.py": f"VALUE = {DEMO_VALUE!r}\n".encode(),
            f"{dist}-{DEMO_VERSION}.dist-info/METADATA":
                f"Metadata-Version: 2.1\nName: {DEMO_PACKAGE}\nVersion: {DEMO_VERSION}\n"
                f"Summary: a package served by the vpnw test world\n".encode(),
            f"{dist}-{DEMO_VERSION}.dist-info/WHEEL":
                b"Wheel-Version: 1.0\nGenerator: vpnw-world\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        }
        record_name = f"{dist}-{DEMO_VERSION}.dist-info/RECORD"
        record = []
        for name, data in files.items():
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append(f"{record_name},,")
        files[record_name] = ("\n".join(record) + "\n").encode()
        packages = self.docroot / "packages"
        packages.mkdir()
        wheel = packages / wheel_name
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in files.items():
                zf.writestr(name, data)
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        project = self.docroot / "simple" / DEMO_PACKAGE
        project.mkdir(parents=True)
        (self.docroot / "simple" / "index.html").write_text(
            f'<!DOCTYPE html><html><body><a href="{DEMO_PACKAGE}/">{DEMO_PACKAGE}</a></body></html>\n')
        (project / "index.html").write_text(
            f'<!DOCTYPE html><html><body><a href="../../packages/{wheel_name}#sha256={sha}">'
            f"{wheel_name}</a></body></html>\n")

    def _make_git_repo(self) -> None:
        src = self.tmp / "git-src"
        git = ["git", "-c", "user.name=world", "-c", "user.email=world@git.world",
               "-c", "init.defaultBranch=main"]
        _check([*git, "init", "-q", str(src)])
        (src / "README").write_text(GIT_README)
        _check([*git, "-C", str(src), "add", "README"])
        _check([*git, "-C", str(src), "commit", "-q", "-m", "first"])
        bare = self.docroot / "repo.git"
        _check([*git, "clone", "-q", "--bare", str(src), str(bare)])
        _check(["git", "--git-dir", str(bare), "update-server-info"])
        shutil.rmtree(src)

    def _start_dns(self) -> None:
        self._hosts_file = self.tmp / "dns-hosts"
        self._dns_log = self.tmp / "dns.log"
        self._dns_log.touch()
        self._write_hosts(DEFAULT_NAMES)
        proc = subprocess.Popen(
            ["nsenter", "-t", str(self.internet_pid), "-n", "--",
             "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--pid-file",
             "--user=root", "--group=root",
             f"--listen-address={DNS_ADDR}", "--bind-interfaces", "--port=53",
             "--no-resolv", "--no-hosts", "--no-poll", f"--addn-hosts={self._hosts_file}",
             "--local-ttl=1", "--log-queries", f"--log-facility={self._dns_log}",
             # Everything not in the table is answered (NXDOMAIN) here, never forwarded.
             "--local=/#/"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._started.append(proc)
        self._dnsmasq = proc
        self._await_log(lambda text: "started, version" in text, "dnsmasq did not start", proc)
        self._names = dict(DEFAULT_NAMES)

    def _write_hosts(self, names: dict[str, list[str]]) -> None:
        lines = [f"{addr}\t{name}" for name, addrs in sorted(names.items()) for addr in addrs]
        tmp = self._hosts_file.with_suffix(".new")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.chmod(0o644)
        tmp.replace(self._hosts_file)

    def _await_log(self, done, what: str, proc: subprocess.Popen) -> None:
        for _ in range(4000):
            if done(self._dns_log.read_text(errors="replace")):
                return
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise WorldError(f"{what}: exited {proc.returncode}: {err.strip()}")
            time.sleep(0.005)
        raise WorldError(what)

    def _start_web(self) -> None:
        self._web_log = self.tmp / "web.log"
        read_end, write_end = os.pipe()
        proc = subprocess.Popen(
            ["nsenter", "-t", str(self.internet_pid), "-n", "--",
             self.python, str(SERVERS / "http_server.py"), "--docroot", str(self.docroot),
             "--http", "80,8080", "--https", "443", "--cert", str(self._server_cert),
             "--key", str(self._server_key), "--log", str(self._web_log),
             "--ready-fd", str(write_end)],
            pass_fds=(write_end,), stdin=subprocess.DEVNULL)
        os.close(write_end)
        self._started.append(proc)
        with os.fdopen(read_end, "rb") as ready:
            if ready.readline() != b"ready\n":
                raise WorldError(f"the web server did not start (exit {proc.poll()})")

    # ── DNS ──────────────────────────────────────────────────────────────
    def dns_set(self, name: str, addrs: Iterable[str]) -> None:
        """Answer `name` with `addrs` from now on (an empty list removes it)."""
        addrs = list(addrs)
        if addrs:
            self._names[name] = addrs
        else:
            self._names.pop(name, None)
        self.dns_reset(self._names)

    def dns_reset(self, names: dict[str, list[str]] | None = None) -> None:
        names = dict(DEFAULT_NAMES if names is None else names)
        marker = f"read {self._hosts_file}"
        before = self._dns_log.read_text(errors="replace").count(marker)
        self._write_hosts(names)
        self._names = names
        os.kill(self._dnsmasq.pid, signal.SIGHUP)
        # dnsmasq logs each (re)read of the table: wait for the new one.
        self._await_log(lambda text: text.count(marker) > before,
                        "dnsmasq did not reload its table", self._dnsmasq)

    def dns_mark(self) -> int:
        """A position in the query log; pass it to dns_queries(since=...)."""
        self._dns_sync()
        return len(self._query_lines())

    def dns_queries(self, since: int = 0) -> list[str]:
        """Names looked up at our DNS server (since a mark), oldest first."""
        self._dns_sync()
        return [name for _, name, _ in self._query_lines()[since:]]

    def dns_query_log(self, since: int = 0) -> list[tuple[str, str, str]]:
        """(type, name, client address) for each query since a mark."""
        self._dns_sync()
        return self._query_lines()[since:]

    def _query_lines(self) -> list[tuple[str, str, str]]:
        out = []
        for line in self._dns_log.read_text(errors="replace").splitlines():
            m = _QUERY_RE.search(line)
            if m and not m.group(2).endswith(_SYNC_SUFFIX):
                out.append((m.group(1), m.group(2).rstrip(".").lower(), m.group(3)))
        return out

    def _dns_sync(self) -> None:
        # dnsmasq answers in order: once a fresh marker name shows in the log,
        # every query sent before it is there too.
        self._sync_n = getattr(self, "_sync_n", 0) + 1
        marker = f"s{self._sync_n}-{os.getpid()}{_SYNC_SUFFIX}"
        subprocess.run(["nsenter", "-t", str(self.world_pid), "-n", "-m", "--",
                        "getent", "ahostsv4", marker], capture_output=True)
        self._await_log(lambda text: marker in text, "dnsmasq did not log a query", self._dnsmasq)

    # ── running things in the world ──────────────────────────────────────
    def _owned_dir(self, path: Path, user: str, mode: int) -> Path:
        path.mkdir(mode=mode)
        pw = pwd.getpwnam(user)
        os.chown(path, pw.pw_uid, pw.pw_gid)
        return path

    def _home(self, user: str) -> Path:
        home = self.tmp / f"home-{user}"
        return home if home.exists() else self._owned_dir(home, user, 0o700)

    def state_home(self, user: str = "root") -> Path:
        """A fresh directory for XDG_STATE_HOME, owned by `user`."""
        self._state_counter += 1
        return self._owned_dir(self.tmp / f"state-{user}-{self._state_counter}", user, 0o700)

    def file(self, name: str, text: str | bytes, mode: int = 0o644) -> Path:
        """Write a file into world.tmp that every user can read."""
        path = self.tmp / "files" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o755)
        if isinstance(text, str):
            path.write_text(text)
        else:
            path.write_bytes(text)
        path.chmod(mode)
        return path

    def program(self, name: str) -> Path:
        """Copy a program from tests/world_servers (with content.py beside it)
        into world.tmp, where every user can read it; return its path."""
        for each in (name, "content.py"):
            self.file(each, (SERVERS / each).read_bytes())
        return self.tmp / "files" / name

    def workdir(self, user: str = "root") -> Path:
        """A fresh empty directory owned by `user` (e.g. for git clone)."""
        self._state_counter += 1
        return self._owned_dir(self.tmp / f"work-{user}-{self._state_counter}", user, 0o755)

    def command(self, cmd: Sequence[str], *, user: str = "root", env: dict | None = None,
                state_home: Path | None = None, cwd: Path | None = None,
                binds: dict | None = None) -> tuple[list[str], Path]:
        """The argv that runs `cmd` in the world as `user` with a clean environment.
        `binds` ({target: source}) are bound over their targets for this
        command alone (private_binds), never in the world's mount namespace."""
        if user not in ("root", UNPRIVILEGED_USER) and not user_exists(user):
            raise WorldError(f"no user {user!r}")
        if state_home is None:
            state_home = self.state_home(user)
        home = self._home(user)
        full_env = {"PATH": PATH, "HOME": str(home), "USER": user, "LOGNAME": user,
                    "LANG": "C.UTF-8", "XDG_STATE_HOME": str(state_home)}
        if STARTUP_TRICKS in os.environ:      # the suite run with the start-up tricks off (.ci/run)
            full_env[STARTUP_TRICKS] = os.environ[STARTUP_TRICKS]
        full_env.update(env or {})
        argv = ["nsenter", "-t", str(self.world_pid), "-n", "-m", "--", *private_binds(binds or {})]
        if user != "root":
            argv += ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
        argv += ["env", "-i", "-C", str(cwd or home), *(f"{k}={v}" for k, v in full_env.items()),
                 *map(str, cmd)]
        return argv, state_home

    def run(self, cmd: Sequence[str], *, user: str = "root", env: dict | None = None,
            input: str | bytes | None = None, timeout: float = 60, check: bool = False,
            text: bool = True, state_home: Path | None = None, cwd: Path | None = None,
            binds: dict | None = None) -> WorldResult:
        argv, state_home = self.command(cmd, user=user, env=env, state_home=state_home, cwd=cwd,
                                        binds=binds)
        if text and isinstance(input, bytes):
            input = input.decode()
        proc = subprocess.run(argv, input=input, capture_output=True, timeout=timeout, text=text,
                              errors="replace" if text else None,
                              stdin=None if input is not None else subprocess.DEVNULL)
        result = WorldResult(list(cmd), proc.returncode, proc.stdout, proc.stderr)
        result.state_home = state_home
        if check and proc.returncode != 0:
            raise WorldError(f"{list(cmd)} as {user} -> {proc.returncode}\n"
                             f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
        return result

    def popen(self, cmd: Sequence[str], *, user: str = "root", env: dict | None = None,
              state_home: Path | None = None, cwd: Path | None = None, binds: dict | None = None,
              **popen_kw) -> subprocess.Popen:
        """Start `cmd` in the world; it is killed at teardown if still running.
        The returned Popen has a `state_home` attribute."""
        argv, state_home = self.command(cmd, user=user, env=env, state_home=state_home, cwd=cwd,
                                        binds=binds)
        popen_kw.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(argv, **popen_kw)
        proc.state_home = state_home
        self._started.append(proc)
        return proc

    def vpnw(self, args: Sequence[str], *, user: str = "root", env: dict | None = None,
             **kw) -> WorldResult:
        """Run this venv's `vpnw` console script in the world."""
        return self.run([str(self.vpnw_path), *args], user=user, env=env, **kw)

    def internet_run(self, cmd: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """Run a command (as root) in the internet namespace."""
        return subprocess.run(["nsenter", "-t", str(self.internet_pid), "-n", "--", *cmd],
                              capture_output=True, text=True, **kw)

    def web_log(self) -> list[str]:
        """The web server's access log: '<peer> "<request line>" <status> ...'."""
        return self._web_log.read_text().splitlines() if self._web_log.exists() else []

    # ── exit sites: a network of its own behind the internet ────────────
    def exit_site(self, address: str = "10.8.0.1") -> int:
        """A network namespace (e.g. an office) holding `address`, reachable
        from the world through the internet namespace; returns the pid whose
        /proc/PID/ns/net is that namespace (made once per address).

            world --vw0/vi0--> internet --vx*/vs0--> site (address/30, default via .2)

        The internet namespace forwards between its two links; everything the
        site dials goes to the internet namespace like the world's traffic, so
        servers see the site's address as the peer.
        """
        sites = self.__dict__.setdefault("_exit_sites", {})
        if address in sites:
            return sites[address]
        site = ipaddress.ip_network(f"{address}/30", strict=False)
        if str(site[1]) != address:
            raise WorldError(f"an exit site address must be the first host of its /30: {address}")
        peer = str(site[2])
        pid = self._hold("--net")
        name = f"vx{len(sites)}"
        s = lambda *argv: _check(["nsenter", "-t", str(pid), "-n", "--", *argv])
        s("ip", "link", "set", "lo", "up")
        s("ip", "link", "add", "vs0", "type", "veth", "peer", "name", name, "netns", str(self.internet_pid))
        s("ip", "addr", "add", f"{address}/30", "dev", "vs0")
        s("ip", "link", "set", "vs0", "up")
        s("ip", "route", "add", "default", "via", peer, "dev", "vs0")
        i = self.in_internet
        i("ip", "addr", "add", f"{peer}/30", "dev", name)
        i("ip", "link", "set", name, "up")
        # Like the world's address: the site's is routed over its link, not answered locally.
        i("ip", "rule", "add", "pref", "100", "to", f"{address}/32", "lookup", "main")
        i("sysctl", "-qw", "net.ipv4.ip_forward=1")
        sites[address] = pid
        return pid

    # ── teardown ─────────────────────────────────────────────────────────
    def stop(self) -> None:
        for proc in reversed(self._started):
            if proc.poll() is None:
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._started.clear()
        if self.tmp is not None and self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)

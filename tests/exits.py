"""Real proxy exits for tests: danted, microsocks, tinyproxy, squid.

`start_exit(kind, port, ...)` starts one bound to 127.0.0.1:port in the CURRENT
network namespace (of the calling thread: a namespace is per thread, and a
child process inherits its parent thread's), waits until it accepts and
returns an `Exit` whose `stop()` kills it (its own process group, by id).

`hosts` maps names to addresses that only this exit can resolve: the exit runs
in its own mount namespace with a private /etc/hosts bind-mounted over the
real one (needs root). That is how tests prove a name is resolved AT the exit.

`PrivateNetns` is a thread living in a new network namespace (loopback up,
nothing else), for tests that want their exits and dials off the host's
loopback. Everything created from that thread (sockets, child processes)
belongs to the namespace.
"""
from __future__ import annotations

import ctypes
import glob
import os
import pwd
import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

CLONE_NEWNET = 0x40000000

SOCKS_KINDS = ("danted", "microsocks")
HTTP_KINDS = ("tinyproxy", "squid")
# Which kinds can check a username/password here. danted's username method
# needs system accounts, so authenticated SOCKS5 tests use microsocks.
AUTH_KINDS = ("microsocks", "tinyproxy", "squid")

_BINARIES = {"danted": "/usr/sbin/danted", "microsocks": "/usr/bin/microsocks",
             "tinyproxy": "/usr/bin/tinyproxy", "squid": "/usr/sbin/squid"}


def missing(kind: str) -> str | None:
    """Why this exit cannot run here, or None."""
    if not os.access(_BINARIES[kind], os.X_OK):
        return f"{_BINARIES[kind]} is not installed"
    if kind == "squid" and os.geteuid() != 0:
        return "squid needs root to start (it drops to the proxy user)"
    return None


@dataclass
class Exit:
    kind: str
    port: int
    process: subprocess.Popen
    workdir: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def scheme(self) -> str:
        return "http" if self.kind in HTTP_KINDS else "socks5h"

    def log(self) -> str:
        parts = []
        for name in sorted(os.listdir(self.workdir)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.workdir, name), "rb") as handle:
                    parts.append(f"--- {name}\n" + handle.read()[-3000:].decode("utf-8", "replace"))
        return "\n".join(parts)

    def stop(self) -> None:
        if self.process.poll() is None and self.kind == "squid":
            # Asked to stop, squid removes its shared memory segments
            # (/dev/shm/squid-<service>-*); killed, it leaves them behind.
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)
        if self.kind == "squid":
            for name in glob.glob(f"/dev/shm/squid-{_squid_service(self.workdir)}*"):
                try:
                    os.unlink(name)
                except OSError:
                    pass
        shutil.rmtree(self.workdir, ignore_errors=True)


def _write(path: str, text: str, mode: int = 0o644) -> None:
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, mode)


def _danted(workdir: str, port: int, username, password, listen: str = "127.0.0.1") -> list[str]:
    if username is not None:
        raise ValueError("danted's username method needs system accounts; use microsocks for auth")
    _write(f"{workdir}/danted.conf", f"""\
logoutput: {workdir}/danted.log
internal: {listen} port = {port}
external: {'lo' if listen == '127.0.0.1' else listen}
clientmethod: none
socksmethod: none
user.privileged: root
user.unprivileged: nobody
client pass {{ from: 0/0 to: 0/0 }}
socks pass {{ from: 0/0 to: 0/0 }}
""")
    return [_BINARIES["danted"], "-f", f"{workdir}/danted.conf", "-p", f"{workdir}/danted.pid", "-N", "1"]


def _microsocks(workdir: str, port: int, username, password, listen: str = "127.0.0.1") -> list[str]:
    command = [_BINARIES["microsocks"], "-i", listen, "-p", str(port)]
    if username is not None:
        command += ["-u", username, "-P", password]
    return command


def _tinyproxy(workdir: str, port: int, username, password, listen: str = "127.0.0.1") -> list[str]:
    auth = f"BasicAuth {username} {password}\n" if username is not None else ""
    _write(f"{workdir}/tinyproxy.conf", f"""\
Port {port}
Listen {listen}
Timeout 30
MaxClients 64
LogLevel Info
LogFile "{workdir}/tinyproxy.log"
PidFile "{workdir}/tinyproxy.pid"
{auth}""", 0o600)
    return [_BINARIES["tinyproxy"], "-d", "-c", f"{workdir}/tinyproxy.conf"]


def _squid(workdir: str, port: int, username, password, listen: str = "127.0.0.1") -> list[str]:
    if username is not None:
        digest = subprocess.run(["openssl", "passwd", "-apr1", "-stdin"], input=password,
                                capture_output=True, text=True, check=True).stdout.strip()
        _write(f"{workdir}/htpasswd", f"{username}:{digest}\n")
        access = (f"auth_param basic program /usr/lib/squid/basic_ncsa_auth {workdir}/htpasswd\n"
                  "acl authed proxy_auth REQUIRED\nhttp_access allow authed\nhttp_access deny all\n")
    else:
        access = "http_access allow all\n"
    _write(f"{workdir}/squid.conf", squid_conf(workdir, listen, port, access))
    # A service name of its own (-n): squids started side by side must not
    # share their shared memory segments, and stop() removes exactly its own.
    return [_BINARIES["squid"], "-N", "-n", _squid_service(workdir), "-f", f"{workdir}/squid.conf"]


def squid_conf(workdir: str, listen: str, port: int, access: str, *, access_log: str = "none",
               extra: str = "") -> str:
    """A squid.conf that relays only (never caches) and keeps its files in
    workdir; `access`: its http_access lines (the benchmarks use it too)."""
    return f"""\
http_port {listen}:{port}
pid_filename {workdir}/squid.pid
cache_log {workdir}/cache.log
access_log {access_log}
{extra}cache deny all
icp_port 0
htcp_port 0
pinger_enable off
coredump_dir {workdir}
shutdown_lifetime 0 seconds
{access}"""


def _squid_service(workdir: str) -> str:
    return "vpnwtest" + os.path.basename(workdir).rsplit("-", 1)[-1].replace("_", "")


_BUILDERS = {"danted": _danted, "microsocks": _microsocks, "tinyproxy": _tinyproxy, "squid": _squid}


def wait_listening(port: int, process: subprocess.Popen, deadline_s: float = 20.0,
                   host: str = "127.0.0.1") -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def start_exit(kind: str, port: int, username: str | None = None, password: str | None = None,
               hosts: dict[str, str] | None = None, *, listen: str = "127.0.0.1",
               resolver: str | None = None) -> Exit:
    """Start a `kind` exit on listen:port in the calling thread's network namespace.

    `resolver` (an address) gives the exit its own /etc/resolv.conf naming that
    DNS server, in the same private mount namespace as `hosts`."""
    workdir = tempfile.mkdtemp(prefix=f"vpnw-exit-{kind}-")
    os.chmod(workdir, 0o755)
    if kind == "squid" and os.geteuid() == 0:
        # squid writes its log after dropping to the proxy user.
        proxy = pwd.getpwnam("proxy")
        os.chown(workdir, proxy.pw_uid, proxy.pw_gid)
    command = _BUILDERS[kind](workdir, port, username, password, listen)
    mounts = []
    if resolver is not None:
        _write(f"{workdir}/resolv.conf", f"nameserver {resolver}\n")
        mounts.append(f"mount --bind {workdir}/resolv.conf /etc/resolv.conf")
    if hosts is not None:
        _write(f"{workdir}/hosts", "127.0.0.1 localhost\n"
               + "".join(f"{address} {name}\n" for name, address in hosts.items()))
        mounts.append(f"mount --bind {workdir}/hosts /etc/hosts")
    if mounts:
        command = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                   " && ".join(mounts) + ' && exec "$@"', "sh", *command]
    with open(f"{workdir}/stdio.out", "wb") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                   start_new_session=True)
    exit_ = Exit(kind, port, process, workdir, username, password)
    if not wait_listening(port, process, host=listen):
        log = exit_.log()
        exit_.stop()
        raise RuntimeError(f"{kind} did not start listening on {listen}:{port}\n{log}")
    return exit_


def free_port() -> int:
    """A port free on 127.0.0.1 in the calling thread's network namespace."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivateNetns:
    """A worker thread inside a new network namespace with loopback up.

    `run(fn, *args)` calls fn in that thread and returns its result (or raises
    its exception). Needs CAP_SYS_ADMIN (root): a thread of a multi-threaded
    process cannot create a user namespace to get it.
    """

    def __init__(self, join_pid: int | None = None):
        # join_pid: enter that process's network namespace instead of a new one.
        self._join_pid = join_pid
        self._calls: queue.Queue = queue.Queue()
        ready: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True,
                                        name="private-netns")
        self._thread.start()
        error = ready.get()
        if error is not None:
            raise OSError(error)

    def _serve(self, ready: queue.Queue) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if self._join_pid is not None:
            fd = os.open(f"/proc/{self._join_pid}/ns/net", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    ready.put(f"setns(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
                    return
            finally:
                os.close(fd)
            ready.put(None)
            self._serve_calls()
            return
        if libc.unshare(CLONE_NEWNET) != 0:
            ready.put(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
            return
        result = subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, text=True)
        if result.returncode != 0:
            ready.put(f"ip link set lo up: {result.stderr.strip()}")
            return
        ready.put(None)
        self._serve_calls()

    def _serve_calls(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            fn, args, reply = item
            try:
                reply.put((True, fn(*args)))
            except BaseException as exc:  # handed back to the caller's thread
                reply.put((False, exc))

    def run(self, fn, *args):
        reply: queue.Queue = queue.Queue()
        self._calls.put((fn, args, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self._calls.put(None)
        self._thread.join(timeout=10)

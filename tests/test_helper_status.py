"""run_helper's status protocol (docs/architecture.md, "Helper status") and the handoff."""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

from ci_support import needs
from stages.wire import handoff
from stages.wire.status import GO
from stages.config.client_env import ssh_command
from stages.helper.seal import program_env

PY = sys.executable

pytestmark = needs(subprocess.run(["unshare", "-Urn", "true"], capture_output=True).returncode != 0,
                   "this machine cannot create user namespaces")


class Helper:
    """A forked run_helper, as the orchestrator starts it."""

    def __init__(self, argv, **kw):
        self.helper_end, self.broker_end = handoff.link()
        status_r, status_w = os.pipe()
        go_r, self.go_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            self.broker_end.close()
            os.close(status_r)
            os.close(self.go_w)
            from stages.helper.main import run_helper
            run_helper(argv, handoff_fd=self.helper_end.fileno(), status_fd=status_w,
                       go_fd=go_r, **kw)
        self.helper_end.close()
        os.close(status_w)
        os.close(go_r)
        self.status = os.fdopen(status_r, "rb")

    def line(self):
        raw = self.status.readline()
        return json.loads(raw) if raw else None

    def go(self):
        os.write(self.go_w, GO)

    def finish(self):
        os.close(self.go_w)
        rest = [json.loads(x) for x in self.status.read().splitlines()]
        _, st = os.waitpid(self.pid, 0)
        self.broker_end.close()
        self.status.close()
        return rest, os.waitstatus_to_exitcode(st)


def run(argv, **kw):
    h = Helper(argv, **kw)
    ready = h.line()
    assert "ready" in ready, ready
    assert ready["ready"] == {"namespaces": ["user", "net", "pid", "ipc", "mnt"], "seccomp": True,
                              "unix_sockets": kw.get("allow_unix_sockets", False),
                              "unix": "all" if kw.get("allow_unix_sockets") else "own",
                              "doors": {"http": 3128, "socks": 1080}}
    h.go()
    final = h.line()
    rest, code = h.finish()
    assert rest == []
    return final, code


def test_true_exits_0():
    assert run(["true"]) == ({"exit": {"code": 0, "signal": None}}, 0)


def test_false_exits_1():
    assert run(["false"]) == ({"exit": {"code": 1, "signal": None}}, 1)


def test_missing_program_is_127():
    final, code = run(["/nonexistent/vpnw-no-such-program"])
    assert final["code"] == 127 and "not found" in final["exec_error"] and code == 127


def test_non_executable_file_is_126():
    with tempfile.NamedTemporaryFile(prefix="vpnw-noexec-") as f:
        final, code = run([f.name])
    assert final["code"] == 126 and "exec_error" in final and code == 126


def test_program_killed_by_sigkill_is_137_signal_9():
    assert run(["sh", "-c", "kill -9 $$"]) == ({"exit": {"code": 137, "signal": 9}}, 137)


def test_allow_unix_sockets_is_reported():
    assert run(["true"], allow_unix_sockets=True)[0] == {"exit": {"code": 0, "signal": None}}


def test_eof_on_go_aborts_without_running_the_program(tmp_path):
    marker = tmp_path / "ran"
    h = Helper(["touch", str(marker)])
    assert "ready" in h.line()
    rest, code = h.finish()
    assert rest == [] and code == 122 and not marker.exists()


def _marks(trace) -> list[str]:
    try:
        return [" ".join(line.split(" ", 4)[3:]) for line in trace.read_text().splitlines()]
    except FileNotFoundError:
        return []


@pytest.mark.parametrize("go", [True, False], ids=["go", "eof"])
def test_the_program_is_sealed_before_go_and_execs_only_after_it(tmp_path, monkeypatch, go):
    """The program's process is forked and sealed while vpnw answers Ready
    (after go it only reads the byte and execs); nothing of the program
    runs before go, and go's EOF ends that process unexec'd. Failed before:
    the process was forked only after go, so no "sealed" before it."""
    import time
    from stages.helper import program
    from stages.startup import trace as startup_trace
    trace, marker = tmp_path / "trace", tmp_path / "ran"
    monkeypatch.setattr(startup_trace, "_path", str(trace))
    monkeypatch.setattr(program, "mark", startup_trace._mark)
    h = Helper(["touch", str(marker)])
    assert "ready" in h.line()
    deadline = time.monotonic() + 20
    while "program sealed" not in _marks(trace) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "program sealed" in _marks(trace)
    time.sleep(0.2)
    assert not marker.exists() and "program go, exec" not in _marks(trace)
    if go:
        h.go()
        assert h.line() == {"exit": {"code": 0, "signal": None}}
    rest, code = h.finish()
    assert rest == [] and code == (0 if go else 122)
    assert marker.exists() == go
    marks = _marks(trace)
    assert ("program go, exec" in marks) == go
    if go:
        assert marks.index("program sealed") < marks.index("program go, exec")


def test_go_reaches_the_program_without_a_hop_through_the_helper(tmp_path):
    """vpnw's go pipe goes down to the program's sealed process, which reads
    its own byte of go: it execs while the helper is stopped. Failed before:
    the helper passed go on, so a stopped helper held the program back."""
    import time
    marker = tmp_path / "ran"
    h = Helper(["touch", str(marker)])
    assert "ready" in h.line()
    os.kill(h.pid, signal.SIGSTOP)
    try:
        h.go()
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists()
    finally:
        os.kill(h.pid, signal.SIGCONT)
    assert h.line() == {"exit": {"code": 0, "signal": None}}
    rest, code = h.finish()
    assert rest == [] and code == 0


def test_environment_is_the_callers_plus_proxy_settings(tmp_path):
    env = {"PATH": os.environ["PATH"], "KEEP": "1", "no_proxy": "*", "No_Proxy": "x",
           "HTTPS_PROXY": "socks5://evil:1", "HOME": str(tmp_path)}
    out = program_env(env)
    doors = {k: v for k, v in out.items() if k.upper() in
             ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "NODE_USE_ENV_PROXY")}
    assert doors == {
        "HTTP_PROXY": "http://127.0.0.1:3128", "HTTPS_PROXY": "http://127.0.0.1:3128",
        "http_proxy": "http://127.0.0.1:3128", "https_proxy": "http://127.0.0.1:3128",
        "ALL_PROXY": "http://127.0.0.1:3128", "all_proxy": "http://127.0.0.1:3128",
        "NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1",
        "NODE_USE_ENV_PROXY": "1"}
    assert out["KEEP"] == "1" and out["PATH"] == os.environ["PATH"]
    # Each client's own settings too (stages/config/client_env.py; tests/test_client_env.py).
    assert out["GIT_SSH_COMMAND"] == ssh_command(sys.executable)
    assert out["npm_config_proxy"] == "http://127.0.0.1:3128"


def test_program_sees_the_proxy_environment():
    h = Helper(["sh", "-c", 'test "$HTTPS_PROXY" = http://127.0.0.1:3128 && '
                            'test "$no_proxy" = localhost,127.0.0.1,::1 && test "$KEEP" = 1'],
               env={"PATH": os.environ["PATH"], "KEEP": "1", "NO_PROXY": "*"})
    assert "ready" in h.line()
    h.go()
    assert h.line() == {"exit": {"code": 0, "signal": None}}
    h.finish()


def test_handed_doors_arrive_and_carry_the_connection():
    prog = ("import socket; s = socket.create_connection(('127.0.0.1', 1080)); "
            "s.sendall(b'hello'); print(s.recv(16).decode())")
    h = Helper([PY, "-c", prog], env={**os.environ})
    assert "ready" in h.line()
    # Both doors (IPv4, and IPv6 where the kernel has it) came before "ready".
    doors = []
    while select.select([h.broker_end], [], [], 0)[0]:
        doors.append(handoff.receive(h.broker_end))
    assert {(d.kind, d.door) for d in doors} == {("door", "http"), ("door", "socks")}
    socks = next(d.sock for d in doors if d.door == "socks" and d.sock.family == socket.AF_INET)
    assert socks.getsockname() == ("127.0.0.1", 1080)
    h.go()
    # The listening socket lives in the sandbox's network namespace: what is
    # accepted on it here, outside, is the program's connection.
    socks.settimeout(20)
    conn, _ = socks.accept()
    conn.settimeout(20)
    assert conn.recv(16) == b"hello"
    conn.sendall(b"bye")
    conn.close()
    for d in doors:
        d.sock.close()
    assert h.line() == {"exit": {"code": 0, "signal": None}}
    h.finish()


def test_sigterm_to_the_helper_reaches_the_program():
    h = Helper(["sleep", "30"])
    assert "ready" in h.line()
    h.go()
    # The helper forwards SIGTERM to init, init to the program; wait until the
    # program is running by retrying until the report arrives.
    while not select.select([h.status], [], [], 0.2)[0]:
        os.kill(h.pid, signal.SIGTERM)
    assert h.line() == {"exit": {"code": 143, "signal": 15}}
    h.finish()


def test_max_user_namespaces_zero_gives_122_and_the_program_never_runs(tmp_path):
    marker = tmp_path / "ran"
    script = ("echo 0 > /proc/sys/user/max_user_namespaces && "
              f"exec {PY} -m stages.helper -- touch {marker}")
    proc = subprocess.run(["unshare", "-U", "-r", "--fork", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 122, proc.stderr
    status = json.loads(proc.stderr.split("vpnw-helper: ", 1)[1])
    assert status["code"] == 122 and "vpnw doctor" in status["error"]
    assert "max_user_namespaces" in status["error"]
    assert not marker.exists()


def test_a_failure_of_the_helper_itself_is_reported_as_125(tmp_path):
    # A handoff descriptor that is not open: the helper seals, then fails on
    # its own code (not the machine's) as it hands the doors over, so it must
    # say 125 (vpnw failed), never 122 (no sandbox here); the program never starts.
    status_r, status_w = os.pipe()
    go_r, go_w = os.pipe()
    closed_fd = 1000   # far above what the helper opens, so no pipe of its own takes the number
    try:
        os.close(closed_fd)
    except OSError:
        pass
    pid = os.fork()
    if pid == 0:
        os.close(status_r)
        os.close(go_w)
        from stages.helper.main import run_helper
        run_helper(["sleep", "30"], handoff_fd=closed_fd, status_fd=status_w, go_fd=go_r)
    os.close(status_w)
    os.close(go_r)
    with os.fdopen(status_r, "rb") as status:
        # It fails handing the doors over, before "ready": the program never starts.
        final = json.loads(status.readline())
        assert status.read() == b""
    os.close(go_w)
    _, st = os.waitpid(pid, 0)
    assert final.get("code") == 125 and "the sandbox helper failed" in final.get("error", ""), final
    assert os.waitstatus_to_exitcode(st) == 125

"""The seal: every way out we know of, tried from inside the sandbox.

Each test names the results it accepts and fails on anything else, success
included; where the attempt is safe on this machine it is also made outside
the sandbox as the control, to show the attempt itself works. Nothing here
can leave the machine: inside, there is no route; outside, only loopback,
temp-dir Unix sockets and local syscalls are used.
"""
from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ci_support import cannot, needs

PY = sys.executable
PROGS = Path(__file__).parent / "progs"
UNPRIVILEGED = "nobody"


def _can_unshare() -> bool:
    return subprocess.run(["unshare", "-Urn", "true"], capture_output=True).returncode == 0


pytestmark = needs(not _can_unshare(), "this machine cannot create user namespaces")


@pytest.fixture(scope="session")
def progs_dir():
    """A 0755 copy of tests/progs, so an unprivileged user can run them."""
    d = tempfile.mkdtemp(prefix="vpnw-progs-")
    os.chmod(d, 0o755)
    for src in PROGS.iterdir():
        if src.suffix == ".py":
            shutil.copy(src, d)
            os.chmod(os.path.join(d, src.name), 0o644)
    if shutil.which("gcc"):
        out = os.path.join(d, "int80")
        if subprocess.run(["gcc", "-O0", "-o", out, str(PROGS / "int80.c")],
                          capture_output=True).returncode == 0:
            os.chmod(out, 0o755)
    yield Path(d)
    shutil.rmtree(d)


def sealed(argv, *, user=None, allow_unix=False, pass_fds=(), check_rc=True):
    """Run argv under `python -m stages.helper`; return (stdout, stderr)."""
    cmd = [PY, "-m", "stages.helper"] + (["--allow-unix-sockets"] if allow_unix else []) + ["--"] + argv
    if user:
        cmd = ["runuser", "-u", user, "--"] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, pass_fds=pass_fds,
                          cwd="/")
    if check_rc:
        assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout, proc.stderr


def probe(progs_dir, name, arg=None, **kw) -> str:
    out, err = sealed([PY, str(progs_dir / "probe.py"), name] + ([str(arg)] if arg is not None else []), **kw)
    results = [line.split()[1] for line in out.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 1, (out, err)
    return results[0]


def control(progs_dir, name, arg=None) -> str:
    out = subprocess.run([PY, str(progs_dir / "probe.py"), name] + ([str(arg)] if arg is not None else []),
                         capture_output=True, text=True, timeout=30).stdout
    return out.split()[1]


# ------------------------------------------------------------ privileges

@pytest.mark.parametrize("user", [None, UNPRIVILEGED])
def test_program_has_no_capabilities_no_new_privs_and_a_filter(progs_dir, user):
    if user:
        pwd.getpwnam(user)
    out, _ = sealed([PY, str(progs_dir / "probe.py"), "status"], user=user)
    status = dict(line.split()[1:3] for line in out.splitlines() if line.startswith("STATUS "))
    for cap in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"):
        assert int(status[cap], 16) == 0, (cap, status)
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"


@pytest.mark.parametrize("user", [None, UNPRIVILEGED])
def test_namespace_holds_only_lo_and_loopback_routes(user):
    out, _ = sealed(["sh", "-c", "ip -o link; echo ROUTES; ip route show table all; "
                                 "ip -6 route show table all"], user=user)
    links, routes = out.split("ROUTES\n")
    assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"]
    for line in routes.splitlines():
        assert " dev lo " in line + " " and ("127." in line or "::1" in line or "ff00::" in line), line
    assert "default" not in routes


# ------------------------------------------------------------ direct connections

def test_direct_tcp4_is_unreachable(progs_dir):
    assert probe(progs_dir, "tcp4") == "ENETUNREACH"


def test_direct_tcp6_is_unreachable(progs_dir):
    assert probe(progs_dir, "tcp6") in ("ENETUNREACH", "EADDRNOTAVAIL")


def test_udp_sendto_is_unreachable(progs_dir):
    assert probe(progs_dir, "udp4") == "ENETUNREACH"


@pytest.mark.world
def test_name_lookup_fails(progs_dir, world):
    # A name the test world's DNS answers: found outside (the control), not inside.
    name = "api.github.com"
    control_out = world.run([PY, str(progs_dir / "probe.py"), "dns", name]).stdout
    assert control_out.split()[1] == "OK", control_out
    r = world.run([PY, "-m", "stages.helper", "--", PY, str(progs_dir / "probe.py"), "dns", name])
    assert [line for line in r.stdout.splitlines() if line.startswith("RESULT ")] == \
        ["RESULT GAIERROR"], (r.stdout, r.stderr)


# ------------------------------------------------------------ local services

def test_unix_socket_by_path_is_refused(progs_dir):
    d = tempfile.mkdtemp(prefix="vpnw-unix-")
    os.chmod(d, 0o755)
    path = os.path.join(d, "sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o777)
        listener.listen(4)
        assert control(progs_dir, "unix_path", path) == "OK"
        assert probe(progs_dir, "unix_path", path) in ("EAFNOSUPPORT", "EPERM")
        assert probe(progs_dir, "unix_path", path, user=UNPRIVILEGED) in ("EAFNOSUPPORT", "EPERM")
    finally:
        listener.close()
        shutil.rmtree(d)


def test_allow_unix_sockets_lifts_only_the_unix_rules(progs_dir):
    d = tempfile.mkdtemp(prefix="vpnw-unix-")
    path = os.path.join(d, "sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(4)
        assert probe(progs_dir, "unix_path", path, allow_unix=True) == "OK"
        assert probe(progs_dir, "socketpair_dgram", allow_unix=True) == "OK"
        assert probe(progs_dir, "io_uring", allow_unix=True) == "ENOSYS"
        assert probe(progs_dir, "vsock", allow_unix=True) in ("EAFNOSUPPORT", "EPERM")
    finally:
        listener.close()
        shutil.rmtree(d)


def test_datagram_unix_socketpairs_are_refused(progs_dir):
    assert control(progs_dir, "socketpair_dgram") == "OK"
    assert probe(progs_dir, "socketpair_dgram") == "EPERM"


@pytest.mark.parametrize("name", ["socketpair_stream", "socketpair_seqpacket"])
def test_stream_and_seqpacket_socketpairs_stay_available(progs_dir, name):
    # Deliberate: a connected pair reaches nothing outside (docs/security.md,
    # tests/bypass/test_unix_pairs.py tries every way to point one elsewhere).
    assert probe(progs_dir, name) == "OK"


def test_socket_family_high_bits_do_not_sneak_past(progs_dir):
    assert control(progs_dir, "socket_high_bits") == "OK"  # the kernel reads it as AF_UNIX
    assert probe(progs_dir, "socket_high_bits") in ("EAFNOSUPPORT", "EPERM")


def test_vsock_is_refused(progs_dir):
    assert probe(progs_dir, "vsock") in ("EAFNOSUPPORT", "EPERM")


# ------------------------------------------------------------ other syscall paths

def test_io_uring_is_refused(progs_dir):
    assert probe(progs_dir, "io_uring") == "ENOSYS"


def test_x32_syscall_is_refused(progs_dir):
    # The control: on a kernel without the x32 ABI it is ENOSYS everywhere, and
    # the seal's answer would prove nothing.
    if control(progs_dir, "x32_socket") != "OK":
        pytest.skip("this kernel has no x32 ABI (the same call is ENOSYS outside the sandbox)")
    assert probe(progs_dir, "x32_socket") == "ENOSYS"


def test_int80_socket_is_refused(progs_dir):
    prog = progs_dir / "int80"
    if not prog.exists():
        cannot("gcc is not available to build the i386 syscall probe")
    control_out = subprocess.run([str(prog)], capture_output=True, text=True).stdout
    if control_out.split()[1] != "OK":
        pytest.skip(f"this kernel has no i386 syscall table ({control_out.strip()})")
    out, _ = sealed([str(prog)])
    assert out.split()[1] == "ENOSYS"


def test_tiocsti_is_refused(progs_dir):
    assert control(progs_dir, "tiocsti") == "ENOTTY"  # /dev/null: the kernel's own answer
    assert probe(progs_dir, "tiocsti") == "EPERM"     # the filter answers first


def test_keyring_is_refused(progs_dir):
    assert probe(progs_dir, "keyctl") == "EPERM"


def test_new_user_namespace_is_refused(progs_dir):
    assert control(progs_dir, "unshare_user") == "OK"
    assert probe(progs_dir, "unshare_user") == "EPERM"


def test_creating_a_link_over_netlink_is_refused(progs_dir):
    assert probe(progs_dir, "netlink_newlink") == "EPERM"
    assert probe(progs_dir, "netlink_newlink", user=UNPRIVILEGED) == "EPERM"


# ------------------------------------------------------------ processes and fds

def test_inherited_fd_is_closed(progs_dir):
    r, w = os.pipe()
    try:
        out, _ = sealed([PY, str(progs_dir / "probe.py"), "fd_open", str(r)], pass_fds=(r,))
        assert "RESULT EBADF" in out
        out, _ = sealed([PY, str(progs_dir / "probe.py"), "fds"], pass_fds=(r, w))
        fds = next(line for line in out.splitlines() if line.startswith("FDS")).split()[1:]
        assert set(fds) <= {"0", "1", "2", "3"}  # 3 = the listing's own directory fd
    finally:
        os.close(r)
        os.close(w)


def test_outside_processes_are_invisible(progs_dir):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert control(progs_dir, "kill0", sleeper.pid) == "OK"
        assert probe(progs_dir, "kill0", sleeper.pid) == "ESRCH"
        assert probe(progs_dir, "ptrace_attach", sleeper.pid) == "ESRCH"
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("user", [None, UNPRIVILEGED])
def test_no_visible_process_can_be_ptraced(progs_dir, user):
    # The helper is outside the PID namespace; init (PID 1) is non-dumpable.
    assert probe(progs_dir, "ptrace_all", user=user) == "EPERM"
    out, _ = sealed(["sh", "-c", "ls /proc | grep -E '^[0-9]+$' | wc -l"], user=user)
    assert int(out) <= 5  # init, sh, ls, grep, wc: nothing from outside


# ------------------------------------------------------------ the doors

def test_doors_accept_the_programs_very_first_connection(progs_dir):
    for _ in range(20):
        out, err = sealed([PY, str(progs_dir / "probe.py"), "door", "3128"])
        assert "RESULT OK" in out, (out, err)
        assert "vpnw-helper: conn http" in err
    out, err = sealed([PY, str(progs_dir / "probe.py"), "door", "1080"])
    assert "RESULT OK" in out and "vpnw-helper: conn socks" in err

"""The Unix-socket supervisor's pure parts: the address as the kernel reads
it, the verdict, and the sock_diag parser (byte by byte and fuzzed)."""
from __future__ import annotations

import os
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from stages.helper.supervisor.judge import UnixDestination, unix_destination
from stages.helper.supervisor.program_threads import threads_in
from stages.helper.supervisor.reports import shown
from stages.helper.seccomp_rules import filter_rules
from stages.kernel import unix_diag

FAMILY = struct.pack("=H", socket.AF_UNIX)


@pytest.mark.parametrize("raw,expected", [
    (FAMILY + b"/run/docker.sock", UnixDestination("path", b"/run/docker.sock")),
    (FAMILY + b"/run/docker.sock\0garbage", UnixDestination("path", b"/run/docker.sock")),
    (FAMILY + b"rel.sock\0", UnixDestination("path", b"rel.sock")),
    (FAMILY + b"\0name", UnixDestination("abstract", b"\0name")),
    (FAMILY + b"\0name\0with\0nuls", UnixDestination("abstract", b"\0name\0with\0nuls")),
    (FAMILY, UnixDestination("invalid", b"")),                                   # autobind is bind's
    (struct.pack("=H", socket.AF_INET) + b"/x", UnixDestination("invalid", b"")),
    (FAMILY + b"/" * 109, UnixDestination("invalid", b"")),                      # past sockaddr_un
])
def test_the_address_is_read_as_the_kernel_reads_it(raw, expected):
    assert unix_destination(raw) == expected


def test_the_record_shows_abstract_names_with_an_at():
    assert shown(unix_destination(FAMILY + b"\0x11-display")) == "@x11-display"
    assert shown(unix_destination(FAMILY + b"/tmp/\xff.sock")) == "/tmp/\\xff.sock"


def test_the_filter_sends_every_connect_and_refuses_datagram_unix_sockets():
    rules = filter_rules(False, supervised=True)
    assert [r for r in rules if r.syscall in ("connect", "listen")] == [r for r in rules if r.notify]
    assert sorted(r.syscall for r in rules if r.notify) == ["connect", "listen"]
    unix_types = [r for r in rules if r.syscall == "socket" and len(r.args) == 2]
    for sock_type in (socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_RDM, 0, 15):
        assert any(sock_type & mask == value for _i, mask, value in (r.args[1] for r in unix_types))
    for sock_type in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET,
                      socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK):
        assert not any(sock_type & mask == value for _i, mask, value in (r.args[1] for r in unix_types))
    assert not [r for r in filter_rules(False) if r.notify]           # no supervisor: as before


CLONE_VM, CLONE_FS, CLONE_FILES, CLONE_SIGHAND, CLONE_VFORK, CLONE_THREAD = (
    0x100, 0x200, 0x400, 0x800, 0x4000, 0x10000)
# glibc's pthread_create: VM FS FILES SYSVSEM SIGHAND THREAD SETTLS PARENT_SETTID CHILD_CLEARTID
THREAD = 0x3D0F00


def test_with_the_supervisor_a_clone_may_share_the_fd_table_only_as_a_thread():
    """What lets the supervisor answer "continue" to a thread alone in its
    group: no process but its own threads can share its fd table."""
    def refused(rules, flags):
        return any(r.syscall == "clone" and all(flags & m == v for _i, m, v in r.args)
                   for r in rules)
    rules = filter_rules(False, supervised=True)
    assert refused(rules, CLONE_FILES | 17)                     # SIGCHLD: a sharing process
    assert refused(rules, CLONE_VM | CLONE_FILES | CLONE_SIGHAND)
    for flags in (THREAD, 17, CLONE_VM | CLONE_VFORK | 17, CLONE_VM | CLONE_SIGHAND | CLONE_THREAD):
        assert not refused(rules, flags), hex(flags)            # threads, fork, vfork, posix_spawn
    assert not refused(filter_rules(False), CLONE_FILES | 17)  # no supervisor, no "continue"


def test_the_thread_count_is_the_task_directorys_links_past_two():
    import threading
    task = os.open("/proc/self/task", os.O_PATH | os.O_DIRECTORY)
    try:
        before = threads_in(os.fstat(task).st_nlink)
        started, done = threading.Event(), threading.Event()

        def wait():
            started.set()
            done.wait()
        thread = threading.Thread(target=wait)
        thread.start()
        started.wait()
        assert threads_in(os.fstat(task).st_nlink) == before + 1
        done.set()
        thread.join()
    finally:
        os.close(task)
    assert before >= 1 and threads_in(2) == 0           # a thread that is gone: none


# A filter whose one notify rule is getppid (x86_64's 110): enough for a listener.
NOTIFY_GETPPID = b"".join(struct.pack("=HBBI", *i) for i in (
    (0x20, 0, 0, 0), (0x15, 0, 1, 110), (0x06, 0, 0, 0x7FC00000), (0x06, 0, 0, 0x7FFF0000)))


@pytest.mark.skipif(tuple(map(int, os.uname().release.split(".")[:2])) < (6, 6),
                    reason="SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP is Linux 6.6+")
def test_the_listener_takes_the_synchronous_wake_up():
    """The supervisor's listener hands the CPU from the program's thread to
    the supervisor and back (SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP). Before, the
    flag went as a pointer to it, and the kernel refused it (EINVAL)."""
    from stages.helper.seccomp_rules import load_bpf
    from stages.kernel.seccomp_notify import wake_up_synchronously
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if wake_up_synchronously(load_bpf(NOTIFY_GETPPID, listener=True)) else 2
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _message(kind: int, body: bytes, seq: int = 1) -> bytes:
    length = 16 + len(body)
    return struct.pack("=IHHII", length, kind, 2, seq, 0) + body + b"\0" * (-length % 4)


def _listener(ino: int, vfs: tuple[int, int] | None) -> bytes:
    body = struct.pack("=BBBBI2I", socket.AF_UNIX, socket.SOCK_STREAM, 10, 0, ino, 0, 0)
    if vfs is not None:
        body += struct.pack("=HH", 12, unix_diag.UNIX_DIAG_VFS) + struct.pack("=II", *vfs)
    return _message(unix_diag.SOCK_DIAG_BY_FAMILY, body)


def test_the_dump_gives_device_and_inode_in_stat_form():
    kernel_dev = (259 << 20) | 3                      # MKDEV(259, 3), as the kernel keeps it
    data = _listener(1, (4242, kernel_dev)) + _listener(2, None) + _message(unix_diag.NLMSG_DONE,
                                                                            b"\0" * 4)
    found, done = unix_diag.parse_listeners(data)
    assert done and found == {(os.makedev(259, 3), 4242)}


def test_an_error_answer_is_a_diag_error():
    with pytest.raises(unix_diag.DiagError, match="refused"):
        unix_diag.parse_listeners(_message(unix_diag.NLMSG_ERROR, struct.pack("=i", -1) + b"\0" * 16))


def test_the_listeners_of_this_namespace_include_one_we_bind(tmp_path):
    path = tmp_path / "l.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        s.listen()
        st = os.stat(path)
        with unix_diag.open_diag() as diag:
            assert (st.st_dev, st.st_ino & 0xFFFFFFFF) in unix_diag.listening_files(diag)


@settings(max_examples=300, deadline=None)
@given(hs.binary(max_size=200))
def test_any_bytes_parse_or_raise_diag_error(data):
    try:
        found, done = unix_diag.parse_listeners(data)
    except unix_diag.DiagError:
        return
    assert isinstance(found, set) and isinstance(done, bool)


@settings(max_examples=300, deadline=None)
@given(hs.binary(max_size=130))
def test_any_address_is_a_destination(raw):
    d = unix_destination(raw)
    assert d.kind in ("path", "abstract", "invalid")


def test_without_what_the_supervisor_needs_every_unix_socket_stays_refused(monkeypatch):
    from stages.helper import seal
    from stages.helper.supervisor import launch
    monkeypatch.setattr(launch, "missing", lambda: "the kernel lacks pidfd_getfd()")
    assert seal._unix_plan(False, [("$SSH_AUTH_SOCK", "/tmp/agent")]) is None
    # ...and with no plan, the filter is the one from before the supervisor:
    # AF_UNIX refused at socket(), no connect() notified.
    rules = filter_rules(False, supervised=False)
    assert not [r for r in rules if r.notify]
    unix_refused = [r for r in rules if r.syscall == "socket" and len(r.args) == 1
                    and socket.AF_UNIX & r.args[0][1] == r.args[0][2]]
    assert unix_refused


def test_a_path_is_followed_through_its_symlinks_to_proc_self():
    from stages.helper.supervisor.program_paths import leads_through_proc_self
    links = {b"/tmp/l": b"/proc/self/root/run/docker.sock", b"/tmp/rel": b"../proc/thread-self/cwd",
             b"/tmp/chain": b"/tmp/l", b"/tmp/loop": b"/tmp/loop", b"/tmp/other": b"/run/x.sock",
             b"/p": b"proc"}
    through = lambda path: leads_through_proc_self(path, links.get)  # noqa: E731
    assert through(b"/tmp/l")
    assert through(b"/tmp/rel/s.sock")
    assert through(b"/tmp/chain")
    assert through(b"/tmp/../../proc/./self/root/x")            # ".." stops at the root
    assert through(b"/p/self/cwd/x.sock")
    assert not through(b"/tmp/other")
    assert not through(b"/tmp/loop")                               # ELOOP, not /proc
    assert not through(b"/proc/1/root/x")
    assert not through(b"/proc/selfish/x")


def test_run_start_names_the_unix_allow_entries_as_resolved_within_its_budget():
    from stages.orchestrator.run_start import UNIX_ALLOW_BUDGET, unix_allow_record
    entries = ("$SSH_AUTH_SOCK", "$UNSET", "/run/x.sock")
    assert unix_allow_record(entries, {"SSH_AUTH_SOCK": "/tmp/ssh-a/agent.1"}) == {"unix_allow": [
        {"entry": "$SSH_AUTH_SOCK", "path": "/tmp/ssh-a/agent.1"},
        {"entry": "$UNSET", "path": None}, {"entry": "/run/x.sock", "path": "/run/x.sock"}]}
    assert unix_allow_record((), {}) == {}
    many = tuple(f"/run/user/1000/s{i:03}-" + "é" * 10 for i in range(60))
    got = unix_allow_record(many, {})
    assert 0 < len(got["unix_allow"]) < 60
    assert got["unix_allow_unlisted"] == 60 - len(got["unix_allow"])
    import orjson
    assert len(orjson.dumps(got["unix_allow"])) <= UNIX_ALLOW_BUDGET


# ── issue 47, the Python path's shell (each fails on main 067b69b) ─────────

class _Untouchable:
    """A receiving thread's handles that must not be used: the call is
    refused before anything is read of the thread."""

    def __getattr__(self, name):
        raise AssertionError(f"the supervisor touched the thread ({name}) for a call not its own")


class _Notification:
    def __init__(self, nr, arch, pid):
        self.id, self.nr, self.arch, self.pid = 1, nr, arch, pid
        self.args = (3, 0x1000, 16, 0, 0, 0)


def _bare_supervisor():
    import threading

    from stages.helper.supervisor import judge
    from stages.helper.supervisor.shell import Supervisor
    s = Supervisor.__new__(Supervisor)
    s.listened_bits = bytearray(8192)
    s.view = judge.Sandbox(s.listened_bits, {}, {})
    s.cookie = 1
    s.lock = threading.Lock()
    s.refused_ports = set()
    s.reports = []
    s.report = s.reports.append
    s._who = lambda tid: (7, "prog")
    return s


@pytest.mark.parametrize("nr,arch,pid", [
    (49, 0xC000003E, 4321),                 # bind: a call the filter does not send
    (42, 0x40000003, 4321),                 # i386
    (42 | 0x40000000, 0xC000003E, 4321),    # x32
    (42, 0xC000003E, 0),                    # a TID the supervisor cannot name
    (42, 0xC000003E, 0xFFFFFFFF),           # -1
])
def test_a_notification_the_filter_never_sends_is_refused_untouched(nr, arch, pid):
    import errno
    s = _bare_supervisor()
    assert s._decide(_Notification(nr, arch, pid), _Untouchable(), []) == errno.EPERM


def test_a_refused_connect_to_a_port_once_listened_on_is_not_reported():
    """Issue 47, 5: as the compiled path, which lets such connects go on or
    makes them and reports nothing. A port never listened on is (control)."""
    import errno
    s = _bare_supervisor()
    s._listened(8080)
    s._refused_at_loopback(4321, 8080, errno.ECONNREFUSED)
    assert s.reports == []
    s._refused_at_loopback(4321, 9, errno.ECONNREFUSED)
    assert [r.port for r in s.reports] == [9]


def test_proc_self_behind_dotdot_at_the_root_is_spelled_for_the_thread():
    """Issue 47, 5: ".." at the root is the root, so /../proc/self is
    /proc/self; spelled with the thread's PID, its lookup meets the magic
    link (EXDEV) and is refused with its reason."""
    from stages.helper.supervisor.program_paths import proc_self
    thread_pid = lambda: 7  # noqa: E731 - the thread's PID inside, as /proc would say it
    assert proc_self(b"/../proc/self/root/run/bus", thread_pid) == b"/proc/7/root/run/bus"
    assert proc_self(b"/./../../proc/thread-self/cwd", thread_pid) == b"/proc/7/cwd"
    assert proc_self(b"/proc/self/root/x", thread_pid) == b"/proc/7/root/x"        # control
    assert proc_self(b"/tmp/../proc/self/x", thread_pid) == b"/tmp/../proc/self/x"  # not at the root

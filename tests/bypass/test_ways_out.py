"""Issue 7: every way out of the sandbox we know of, one test each, through a
real `vpnw run` in the test world, as root and as vpnwtest.

Each way lists the errors it accepts inside; anything else fails the test,
success included. Where it is safe, the same attempt is made outside the
sandbox as the control ("world": in the world as the same user; "scratch":
in a user+net+mount namespace of the user's own, for attempts that would
change the world itself); the control must show the attempt works, or, for
an attempt that needs root, that only root can make it there too. The table
below is the source for docs/security.md.
"""
from __future__ import annotations

import glob
import os

import pytest

from ci_support import cannot
from bypass_bench import (BROKER_V4, BROKER_V6, OK, TARGET_TCP, TARGET_UDP, WORLD_HOST_V4,
                          WORLD_HOST_V6, Way, check_control, errnos, plan_of, way)

pytestmark = pytest.mark.world

ROOT_ONLY = dict(root=OK, user={"EPERM"})
# Debian's udev makes /dev/net/tun 0666 (scripts/setup does the same for the
# WireGuard path); some machines keep it 0600. Outside the sandbox the user
# opens it only when its mode says so; inside, never.
TUN_FOR_ALL = os.path.exists("/dev/net/tun") and os.stat("/dev/net/tun").st_mode & 0o006 == 0o006
NOT_OUR_INIT = ("outside, PID 1 is the machine's init, not the sandbox's (non-dumpable) init; "
                "the *-outside ways show the same call working on a process the user may touch")
IORING_FORMS = ["0", "IOPOLL", "SQPOLL", "SQPOLL|SQ_AFF", "CQSIZE", "CLAMP", "ATTACH_WQ",
                "R_DISABLED", "SUBMIT_ALL", "COOP_TASKRUN|TASKRUN_FLAG", "SQE128|CQE32",
                "SINGLE_ISSUER|DEFER_TASKRUN", "NO_SQARRAY"]
CURL = ["curl", "-sS", "-m", "5", "-o", "/dev/null"]
PROXY_VARS = ["http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"]

WAYS: list[Way] = [
    # ── direct traffic: no route ─────────────────────────────────────────
    way("tcp4-world-host", "tcp", WORLD_HOST_V4, 80, accept={"ENETUNREACH"}, control="world"),
    way("tcp6-world-host", "tcp", WORLD_HOST_V6, 80, accept={"ENETUNREACH"}, control="world"),
    way("tcp4-broker-machine", "tcp", BROKER_V4, TARGET_TCP, accept={"ENETUNREACH"}, control="world"),
    way("tcp6-broker-machine", "tcp", BROKER_V6, TARGET_TCP, accept={"ENETUNREACH"}, control="world"),
    way("udp4-world-host", "udp", WORLD_HOST_V4, TARGET_UDP, accept={"ENETUNREACH"}, control="world"),
    way("udp6-world-host", "udp", WORLD_HOST_V6, TARGET_UDP, accept={"ENETUNREACH"}, control="world"),
    way("udp4-dns-server", "udp", "10.53.0.53", 53, "dns", accept={"ENETUNREACH"}, control="world"),
    way("name-lookup", "lookup", "api.github.com", accept={"GAIERROR"}, control="world"),
    # ── other kinds of socket ────────────────────────────────────────────
    way("raw-icmp4", "raw_icmp", WORLD_HOST_V4, accept={"EPERM"}, control="world", **ROOT_ONLY),
    way("raw-icmp6", "raw_icmp", WORLD_HOST_V6, accept={"EPERM"}, control="world", **ROOT_ONLY),
    way("packet-socket", "packet_socket", accept={"EAFNOSUPPORT"}, control="world", **ROOT_ONLY),
    way("ping-socket4", "ping_socket", WORLD_HOST_V4, accept={"EACCES"}, control="world"),
    way("ping-socket6", "ping_socket", WORLD_HOST_V6, accept={"EACCES"}, control="world"),
    # ── reconfiguring the network ────────────────────────────────────────
    way("netlink-add-address", "netlink_addr", accept={"EPERM"}, control="scratch"),
    way("netlink-add-route", "netlink_route", accept={"EPERM"}, control="scratch"),
    way("netlink-add-veth", "netlink_veth", accept={"EPERM"}, control="scratch"),
    way("netlink-move-link-out", "netlink_move_link", "{sleeper}", accept={"EPERM"},
        control="scratch", control_args=("child",)),
    way("tun-device", "tun", accept={"EPERM", "EACCES"}, control="scratch",
        user=OK if TUN_FOR_ALL else {"EACCES"}),
    # ── new namespaces, joining others ───────────────────────────────────
    way("unshare-user-net", "unshare", hex(0x10000000 | 0x40000000), accept={"EPERM"}, control="world"),
    way("unshare-net", "unshare", hex(0x40000000), accept={"EPERM"}, control="world", **ROOT_ONLY),
    way("unshare-mount", "unshare", hex(0x20000), accept={"EPERM"}, control="world", **ROOT_ONLY),
    way("clone-newuser", "clone_newuser", accept={"EPERM"}, control="world"),
    way("clone3-newuser", "clone3_newuser", accept={"ENOSYS"}, control="world"),
    way("unshare-command", "command", "unshare", "-Urn", "true", accept={"EXIT_1"}, control="world"),
    way("setns-every-visible-proc-ns", "setns_every_visible", accept={"EPERM", "EINVAL", "EACCES"},
        control="world"),
    way("setns-outside-proc-path", "setns_paths", "/proc/{holder}/ns/user", "/proc/{holder}/ns/net",
        accept={"ENOENT"}, control="world"),
    way("setns-bind-mounted-user-then-net", "setns_paths", "{bind_user}", "{bind_net}",
        accept={"EPERM"}, control="world"),
    way("setns-bind-mounted-net", "setns_paths", "{bind_net}", accept={"EPERM"}, control="world",
        **ROOT_ONLY),
    # ── the file system and kernel knobs ─────────────────────────────────
    way("mount-tmpfs", "mount_tmpfs", "/tmp", accept={"EPERM"}, control="scratch"),
    way("remount-proc-sys-read-write", "remount_rw", "/proc/sys", accept={"EPERM"},
        why="outside the sandbox /proc/sys is no mount of its own; the remount is the sandbox's"),
    way("chroot", "chroot", "/tmp", accept={"EPERM"}, control="scratch"),
    way("open-by-handle-at", "open_by_handle", "/etc/hostname", accept={"EPERM"}, control="world",
        **ROOT_ONLY),
    way("sysctl-write-kernel", "write_same", "/proc/sys/kernel/printk_ratelimit",
        accept={"EROFS", "EACCES"}, control="world", root=OK, user={"EACCES"}),
    way("sysctl-write-own-netns", "write_same", "/proc/sys/net/ipv4/ip_forward",
        accept={"EROFS", "EACCES"}, control="world", root=OK, user={"EACCES"}),
    # The sandbox's TCP default (reno, set by the helper before the doors
    # listen: docs/architecture.md, "Tunnel throughput: the bound") stays the helper's.
    way("sysctl-write-own-netns-congestion-control", "write_same",
        "/proc/sys/net/ipv4/tcp_congestion_control",
        accept={"EROFS", "EACCES"}, control="world", root=OK, user={"EACCES"}),
    way("sysfs-write", "write_same", "/sys/kernel/mm/ksm/sleep_millisecs",
        accept={"EROFS", "EACCES"}, control="world", root=OK, user={"EACCES"}),
    # Docker's readonlyPaths and maskedPaths (moby oci/defaults.go): the sandbox does the same.
    way("proc-irq-write", "write_same", "/proc/irq/default_smp_affinity",
        accept={"EROFS", "EACCES"}, control="world", root=OK, user={"EACCES"}),
    way("proc-irq-open-for-write", "open_for_write", "/proc/irq/*/smp_affinity",
        accept={"EROFS", "EACCES"}, control="world", root=OK, user={"EACCES"}),
    way("proc-bus-pci-config-open-for-write", "open_for_write", "/proc/bus/pci/*/*.*",
        accept={"EROFS", "EACCES"}, control="world", root=OK, user={"EACCES"}),
    *[way(f"proc-{name}-read-only", "writable_mount", f"/proc/{name}", accept={"EROFS"}, control="world")
      for name in ("bus", "fs", "irq", "sys")],
    *[way(f"masked-{path.strip('/').replace('/', '-')}", "kernel_entry", path, accept={"MASKED"},
          control="world", root=OK, user=user_control)
      for path, user_control in (("/proc/kcore", {"EACCES", "EPERM"}), ("/proc/keys", OK),
                                 ("/proc/timer_list", {"EACCES"}), ("/proc/sched_debug", OK),
                                 ("/proc/latency_stats", OK), ("/proc/timer_stats", OK),
                                 ("/proc/acpi", OK), ("/proc/asound", OK), ("/proc/scsi", OK),
                                 ("/sys/firmware", OK), ("/sys/devices/virtual/powercap", OK))],
    way("bpf-map-create", "bpf_map", accept={"EPERM"}, control="world", **ROOT_ONLY),
    # ── processes outside ────────────────────────────────────────────────
    way("proc-shows-only-the-sandbox", "visible_processes", accept={"NONE_VISIBLE"}, control="world"),
    *[way(f"proc-outside-{what}", "proc_file", "{sleeper}", what, accept={"ENOENT"}, control="world")
      for what in ("environ", "mem", "root", "fd")],
    *[way(f"proc-init-{what}", "proc_file", "1", what, accept={"EACCES", "EPERM"}, why=NOT_OUR_INIT)
      for what in ("environ", "mem", "root", "fd")],
    way("kill-outside", "signal_process", "{sleeper}", 18, accept={"ESRCH"}, control="world"),
    way("pidfd-send-signal-outside", "pidfd_signal", "{sleeper}", 18, accept={"ESRCH"}, control="world"),
    way("pidfd-getfd-outside", "pidfd_getfd", "{sleeper}", 1, accept={"ESRCH"}, control="world"),
    way("pidfd-getfd-init", "pidfd_getfd", 1, 0, accept={"EPERM"}, why=NOT_OUR_INIT),
    way("prlimit-outside", "prlimit", "{sleeper}", accept={"ESRCH"}, control="world"),
    way("setpriority-outside", "setpriority", "{sleeper}", accept={"ESRCH"}, control="world"),
    way("ptrace-outside", "ptrace_seize", "{sleeper}", accept={"ESRCH"}, control="world"),
    way("ptrace-every-visible", "ptrace_every_visible", accept={"EPERM"},
        why="outside, every process of the machine is visible; ptrace-outside shows seizing works"),
    # ── IPC and keys made outside ────────────────────────────────────────
    way("sysv-shm-outside", "sysv", "shm", "{shm_key}", accept={"ENOENT"}, control="world"),
    way("sysv-msg-outside", "sysv", "msg", "{msg_key}", accept={"ENOENT"}, control="world"),
    way("sysv-sem-outside", "sysv", "sem", "{sem_key}", accept={"ENOENT"}, control="world"),
    way("keyring-session", "keyctl_session", accept={"EPERM"}, control="world"),
    way("keyring-add-key", "add_key_process", accept={"EPERM"}, control="world"),
    # ── local services over Unix sockets ─────────────────────────────────
    # Unix sockets bound outside: refused by the supervisor (every other way
    # to them: test_unix_origin.py); an abstract name is the sandbox's own.
    way("unix-socket-by-path", "unix_connect", "{unix_path}", accept={"EPERM"}, control="world"),
    way("unix-socket-abstract", "unix_connect", "@{abstract}", accept={"ECONNREFUSED"}, control="world"),
    way("unix-socketpair-dgram", "socketpair", "dgram", accept={"EPERM"}, control="world"),
    # Connected pairs (stream, seqpacket) are allowed: test_unix_pairs.py.
    # ── io_uring and other system call tables ────────────────────────────
    *[way(f"io-uring-setup-{form.replace('|', '+')}", "io_uring_setup", form, accept={"ENOSYS"},
          control="world") for form in IORING_FORMS],
    way("io-uring-enter", "io_uring_other", "io_uring_enter", accept={"ENOSYS"}, control="world",
        root={"EBADF"}, user={"EBADF"}),
    way("io-uring-register", "io_uring_other", "io_uring_register", accept={"ENOSYS"}, control="world",
        root={"EBADF", "EINVAL"}, user={"EBADF", "EINVAL"}),
    *[way(f"int80-{what}", "native", "{int80}", what, accept={"ENOSYS"}, control="world")
      for what in ("socket", "socketcall", "getpid")],
    # This kernel has no x32 ABI: outside the answer is ENOSYS as well.
    way("x32-socket", "x32", "socket", accept={"ENOSYS"}, control="world", root={"ENOSYS", OK},
        user={"ENOSYS", OK}),
    way("x32-getpid", "x32", "getpid", accept={"ENOSYS"}, control="world", root={"ENOSYS", OK},
        user={"ENOSYS", OK}),
    # Not a way out anywhere: no such call. The filter does not have to know it.
    way("syscall-1000", "syscall_number", 1000, accept={"ENOSYS"}, control="world",
        root={"ENOSYS"}, user={"ENOSYS"}),
    # ── the program ignores or rewrites the proxy settings ───────────────
    way("curl-no-proxy-star", "command", "env", "NO_PROXY=*", "no_proxy=*", *CURL,
        "http://api.github.com/whoami", accept={"EXIT_6", "EXIT_7"}, control="world"),
    way("curl-proxy-variables-unset", "command", "env", *[f"-u{v}" for v in PROXY_VARS], *CURL,
        f"http://{WORLD_HOST_V4}/whoami", accept={"EXIT_7"}, control="world"),
    way("curl-noproxy-option", "command", *CURL, "--noproxy", "*", f"http://[{WORLD_HOST_V6}]/whoami",
        accept={"EXIT_7"}, control="world"),
]

WAY_BY_ID = {w.id: w for w in WAYS}
assert len(WAY_BY_ID) == len(WAYS)
PLAN = plan_of(WAYS)


@pytest.mark.parametrize("way_id", list(WAY_BY_ID))
def test_way_out_is_refused(bench, user, way_id):
    w = WAY_BY_ID[way_id]
    if w.attempt == "native" and bench.int80 is None:
        cannot("no gcc to build the int 0x80 probe")
    if way_id == "sysfs-write" and not __import__("os").path.exists(w.args[0]):
        pytest.skip(f"{w.args[0]} does not exist on this kernel")
    if w.attempt in ("kernel_entry", "open_for_write") and not glob.glob(w.args[0]):
        pytest.skip(f"{w.args[0]} does not exist on this kernel")
    results, _events = bench.inside("ways", user, PLAN)
    res = results[w.id]
    assert not res["ok"], f"a way out: {w.id} worked inside the sandbox: {res}"
    assert errnos(res) <= w.accept, f"{w.id}: expected one of {sorted(w.accept)}, got {res}"
    check_control(bench, user, "ways", PLAN, w)


def test_the_suite_tries_at_least_forty_ways():
    assert len(WAYS) >= 40

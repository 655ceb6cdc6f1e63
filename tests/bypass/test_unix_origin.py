"""Issue 26: Unix sockets by origin. Inside the sandbox a program makes Unix
stream and seqpacket sockets, and every connect() is answered by the
supervisor (stages/helper/supervisor/): a socket bound by the
program's own processes is reached, any other gets EPERM and a unix.deny
event. Every way at a socket bound outside is tried here, through a real
`vpnw run` in the test world, as root and as vpnwtest; each control makes the
same attempt in the world as the same user, where it works (or fails the
same way, where the kernel itself refuses). docs/security.md, "Unix sockets",
says why each one fails inside.

The races ("swap-*"): a second thread changes what the connect() names while
it waits for the supervisor (the address in memory, a symlink, the socket
under the fd number, the socket and the address before it exits); 1,000
connects each, and not one may reach the listener outside (NEVER_OUTSIDE).
Outside, the same race reaches it. "clone-files-sharer": the same swap from
a process that shares the fd table without being a thread; inside, its
clone() is refused (EPERM), outside it reaches the listener.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from bypass_bench import BROKER_V4, PROGS, PYTHON, TARGET_TCP, check_control, errnos, plan_of, way
from progs_support import prog_text
from world import WorldError

pytestmark = pytest.mark.world

R = "{received}"
KERNEL_SAYS_NO = {"EOPNOTSUPP", "ENOTSUP", "ENOTCONN"}      # sendto() with an address on a connected kind
NOT_UNIX = {"EINVAL", "EAFNOSUPPORT"}            # sendto() with a sockaddr_un on an inet socket
WAYS = [
    way("path", "unix_connect", "{unix_path}", accept={"EPERM"}, control="world"),
    way("seqpacket-path", "socket_connect_listener", "seqpacket", "{seqpacket_path}",
        accept={"EPERM"}, control="world"),
    way("symlink", "unix_reach", "symlink", "{unix_path}", accept={"EPERM"}, control="world"),
    way("proc-self-root", "unix_reach", "proc-self-root", "{unix_path}", accept={"EPERM"},
        control="world"),
    way("proc-self-symlink", "unix_reach", "proc-self-symlink", "{unix_path}", accept={"EPERM"},
        control="world"),
    way("proc-pid-cwd", "unix_reach", "proc-pid-cwd", "{unix_path}", accept={"EPERM"},
        control="world"),
    way("relative-path", "unix_reach", "relative", "{unix_path}", accept={"EPERM"}, control="world"),
    # A socket of the user's own outside (a hard link to someone else's socket
    # is the owner's privilege: fs.protected_hardlinks).
    way("hard-link", "unix_reach", "hardlink", "{mine}", accept={"EPERM"}, control="world"),
    way("bind-mount", "unix_connect", "{bound}", accept={"EPERM"}, control="world"),
    # The same from a non-blocking socket, as Node, Go and tokio connect (the
    # compiled path decides those it can: docs/security.md).
    *[way(f"{name}-nonblocking", "unix_reach", how, target, "nonblocking", accept={"EPERM"},
          control="world")
      for name, how, target in [("symlink", "symlink", "{unix_path}"),
                                ("proc-self-root", "proc-self-root", "{unix_path}"),
                                ("proc-self-symlink", "proc-self-symlink", "{unix_path}"),
                                ("relative-path", "relative", "{unix_path}"),
                                ("hard-link", "hardlink", "{mine}")]],
    # The program's own socket's file renamed away and a socket outside
    # linked at its name before listen(): the supervisor records the file
    # the socket's bind made (SIOCUNIXFILE), never what the name holds now.
    *[way(f"relink-before-listen{suffix}", "unix_relink_before_listen", "{mine}", mode,
          accept={"EPERM"}, control="world")
      for suffix, mode in (("", "blocking"), ("-nonblocking", "nonblocking"))],
    way("swap-address-in-memory", "unix_swap_memory", "{unix_path}", accept={"NEVER_OUTSIDE"},
        control="world"),
    way("swap-symlink", "unix_swap_symlink", "{unix_path}", accept={"NEVER_OUTSIDE"},
        control="world"),
    way("swap-socket-under-the-fd", "unix_fd_swap", "{unix_path}", accept={"NEVER_OUTSIDE"},
        control="world"),
    # The "continue" a thread alone in its group gets for a TCP connect
    # (docs/security.md, "Unix sockets by origin"): no other task may change
    # its fd table meanwhile. A second thread that swaps and leaves is
    # counted (the group is counted before the socket is taken); a process
    # sharing the table without being a thread is refused at clone().
    way("swap-socket-then-leave", "unix_swap_and_leave", "{unix_path}",
        accept={"NEVER_OUTSIDE"}, control="world"),
    # A thread that is not alone, on a non-blocking IP socket (Node, Go,
    # tokio): the supervisor (its compiled path too) connects the socket it
    # took to the bytes it read, while two other threads swap the socket
    # under the fd number and the address in memory.
    way("swap-with-many-threads", "unix_swap_many_threads", "{unix_path}",
        accept={"NEVER_OUTSIDE"}, control="world"),
    way("clone-files-sharer", "unix_clone_files_swap", "{unix_path}", accept={"EPERM"},
        control="world"),
    way("scm-rights-passed-socket", "unix_scm_rights", "{unix_path}", accept={"EPERM"},
        control="world"),
    way("abstract", "unix_connect", "@{abstract}", accept={"ECONNREFUSED"}, control="world"),
    way("dgram-socket", "unix_socket_type", "dgram", accept={"EPERM"}, control="world"),
    way("dgram-socket-with-flags", "unix_socket_type", "dgram+flags", accept={"EPERM"},
        control="world"),
    way("raw-socket", "unix_socket_type", "raw", accept={"EPERM"}, control="world"),
    way("sendto-dgram", "unix_sendto", "dgram", "{dgram_path}", R, accept={"EPERM"},
        control="world"),
    way("sendto-stream", "unix_sendto", "stream", "{dgram_path}", R, accept=KERNEL_SAYS_NO,
        control="world", root=KERNEL_SAYS_NO, user=KERNEL_SAYS_NO),
    way("sendto-seqpacket", "unix_sendto", "seqpacket", "{dgram_path}", R, accept=KERNEL_SAYS_NO,
        control="world", root=KERNEL_SAYS_NO, user=KERNEL_SAYS_NO),
    way("sendto-udp", "unix_sendto", "udp", "{dgram_path}", R, accept=NOT_UNIX,
        control="world", root=NOT_UNIX, user=NOT_UNIX),
    way("sendto-tcp", "unix_sendto", "tcp", "{dgram_path}", R, accept=NOT_UNIX | {"EPIPE"},
        control="world", root=NOT_UNIX | {"EPIPE"}, user=NOT_UNIX | {"EPIPE"}),
]
WAY_BY_ID = {w.id: w for w in WAYS}
assert len(WAY_BY_ID) == len(WAYS)

# What programs do must work inside.
WORKS = [("stream", "path"), ("stream", "relative"), ("stream", "abstract"),
         ("seqpacket", "path"), ("stream", "path-nonblocking"), ("seqpacket", "path-nonblocking")]
PLAN = plan_of(WAYS) + [{"id": f"works-{k}-{w}", "attempt": "unix_own", "args": [k, w]}
                        for k, w in WORKS]
REFUSED_BY_SUPERVISOR = {"path": "a socket bound outside the sandbox",
                         "proc-self-root": "a path through a /proc link",
                         "proc-self-symlink": "a path through a /proc link",
                         "bind-mount": "a socket bound outside the sandbox"}


def _outside_targets(bench, user: str) -> None:
    """Per user: a listener of the user's own outside ({mine}); once: the
    world's listener bind-mounted onto another path ({bound})."""
    t = bench.targets_for(user)
    if "mine" in t:
        return
    w = bench.world
    if "bound" not in bench.__dict__:
        bound = bench.dir / "bound.sock"
        bound.touch()
        w.run(["mount", "--bind", bench.unix_path, str(bound)], check=True)
        bench._cleanups.append(lambda: w.run(["umount", str(bound)]))
        bench.bound = str(bound)
    own_dir = bench.dir / f"mine-{user}"
    own_dir.mkdir(exist_ok=True)
    if user != "root":
        w.run(["chown", user, str(own_dir)], check=True)
    targets = PROGS / "bypass_targets.py"
    mine = str(own_dir / "mine.sock")
    proc = w.popen([PYTHON, str(targets), "--unix", mine], user=user, stdout=subprocess.PIPE)
    bench._cleanups.append(lambda: (proc.kill(), proc.wait()))
    if proc.stdout.readline() != b"ready\n":
        raise WorldError(f"the {user} listener outside did not start")
    t["mine"], t["bound"] = mine, bench.bound


def _inside(bench, user):
    _outside_targets(bench, user)
    return bench.inside("unix-origin", user, PLAN)


@pytest.mark.parametrize("way_id", list(WAY_BY_ID))
def test_a_socket_bound_outside_is_out_of_reach(bench, user, way_id):
    w = WAY_BY_ID[way_id]
    results, _events = _inside(bench, user)
    res = results[w.id]
    assert not res["ok"], f"a way out: {w.id} worked inside the sandbox: {res}"
    assert errnos(res) <= w.accept, f"{w.id}: expected one of {sorted(w.accept)}, got {res}"
    check_control(bench, user, "unix-origin", PLAN, w)


# The supervisor's Python path alone, as an install where its compiled
# "continue" (stages/helper/supervisor/fast_continue.c) did not build answers.
PYTHON_PATH = {"VPNW_SUPERVISOR_PYTHON": "1"}


def test_the_python_path_alone_decides_every_way_the_same(bench, user):
    """Every way above, and the program's own sockets, with the compiled path
    turned off: the same refusals (the tests above run the compiled one,
    which setup builds)."""
    _outside_targets(bench, user)
    results, events = bench.inside("unix-origin", user, PLAN, env=PYTHON_PATH)
    wrong = {w.id: results[w.id] for w in WAYS
             if results[w.id]["ok"] or not errnos(results[w.id]) <= w.accept}
    wrong |= {f"works-{k}-{w}": results[f"works-{k}-{w}"] for k, w in WORKS
              if not results[f"works-{k}-{w}"]["ok"]}
    assert not wrong, wrong
    assert {e["fields"]["reason"] for e in events if e["type"] == "unix.deny"} >= \
        set(REFUSED_BY_SUPERVISOR.values())


@pytest.mark.parametrize("kind,where", WORKS, ids=lambda v: v)
def test_the_programs_own_sockets_work(bench, user, kind, where):
    results, _events = _inside(bench, user)
    res = results[f"works-{kind}-{where}"]
    assert res["ok"], res


@pytest.mark.parametrize("way_id", list(REFUSED_BY_SUPERVISOR))
def test_each_refusal_is_in_the_record_with_its_path_and_process(bench, user, way_id):
    _results, events = _inside(bench, user)
    t = bench.targets_for(user)
    path = {"path": t["unix_path"], "proc-self-root": "/proc/self/root" + t["unix_path"],
            "bind-mount": t["bound"], "proc-self-symlink": "/link.sock"}[way_id]
    denials = [e["fields"] for e in events if e["type"] == "unix.deny"]
    # The symlink is in the probe's own scratch directory: its name ends the path.
    mine = [f for f in denials if f["path"] == path or way_id == "proc-self-symlink"
            and f["path"].endswith(path) and f["reason"] == REFUSED_BY_SUPERVISOR[way_id]]
    assert mine, f"no unix.deny for {path} in {denials}"
    assert mine[0]["reason"] == REFUSED_BY_SUPERVISOR[way_id]
    assert mine[0]["program"] == "python3" and mine[0]["process"] > 1, mine[0]
    ready = next(e for e in events if e["type"] == "sandbox.ready")
    assert ready["fields"]["unix"] == "own"


# ── a socket made outside, passed in by a socket the policy names ────────
PASSER = prog_text("unix_passer.py")
PASSED_WAYS = [
    way("passed-in-abstract", "unix_passed_in", "{passer}", "@{abstract}", accept={"EPERM"},
        control="world"),
    way("passed-in-path", "unix_passed_in", "{passer}", "{unix_path}", accept={"EPERM"},
        control="world"),
]
PASSED_PLAN = plan_of(PASSED_WAYS)


def _passer(bench) -> str:
    if "passer" not in bench.__dict__:
        w = bench.world
        script = w.file("unix_passer.py", PASSER)
        path = str(bench.dir / "passer.sock")
        proc = w.popen([PYTHON, str(script), path], stdout=subprocess.PIPE)
        bench._cleanups.append(lambda: (proc.kill(), proc.wait()))
        if proc.stdout.readline() != b"ready\n":
            raise WorldError("the socket passer outside did not start")
        bench.passer = path
        bench.passer_policy = str(w.file("unix_passer.toml",
                                          'version = 1\n[policy]\ndefault = "allow"\n'
                                          f'[unix]\nallow = ["{path}"]\n'))
    return bench.passer


@pytest.mark.parametrize("way_id", [w.id for w in PASSED_WAYS])
def test_a_socket_made_outside_and_passed_in_reaches_nothing_outside(bench, user, way_id):
    """The policy names the passer, a server outside that hands every client
    a fresh Unix socket made outside (in the world's network namespace).
    Connected inside, that socket reaches neither an abstract name of the
    world (it would look there: abstract names are found in the connecting
    socket's namespace) nor a listener by path."""
    passer = _passer(bench)
    bench.targets_for(user)["passer"] = passer
    w = next(x for x in PASSED_WAYS if x.id == way_id)
    results, events = bench.inside("unix-passed-in", user, PASSED_PLAN,
                                   vpnw_args=("run", "--policy", bench.passer_policy))
    res = results[w.id]
    assert not res["ok"], f"a way out: {w.id} worked inside the sandbox: {res}"
    assert errnos(res) <= w.accept, f"{w.id}: expected one of {sorted(w.accept)}, got {res}"
    assert [e for e in events if e["type"] == "unix.allow" and e["fields"]["path"] == passer]
    if way_id == "passed-in-abstract":
        denied = [e["fields"] for e in events if e["type"] == "unix.deny"]
        assert any(f["reason"].startswith("an abstract socket from a socket made outside")
                   for f in denied), denied
    check_control(bench, user, "unix-passed-in", PASSED_PLAN, w)


# ── an IP socket made outside, passed in (issue 47) ──────────────────────
# Made in the world's network namespace, it would connect from there: to
# the world's own loopback listener, or to its address. The supervisor
# compares its SO_NETNS_COOKIE with the sandbox's (both paths).
INET_PASSED_WAYS = [
    way("inet-passed-in-loopback", "inet_passed_in", "{inet_passer}", "127.0.0.1", str(TARGET_TCP),
        accept={"EPERM"}, control="world"),
    way("inet-passed-in-address", "inet_passed_in", "{inet_passer}", BROKER_V4, str(TARGET_TCP),
        accept={"EPERM"}, control="world"),
]
INET_PASSED_PLAN = plan_of(INET_PASSED_WAYS)


def _inet_passer(bench) -> str:
    if "inet_passer" not in bench.__dict__:
        w = bench.world
        script = w.file("unix_passer.py", PASSER)
        path = str(bench.dir / "inet-passer.sock")
        proc = w.popen([PYTHON, str(script), path, "inet"], stdout=subprocess.PIPE)
        bench._cleanups.append(lambda: (proc.kill(), proc.wait()))
        if proc.stdout.readline() != b"ready\n":
            raise WorldError("the IP socket passer outside did not start")
        bench.inet_passer = path
        bench.inet_passer_policy = str(w.file("inet_passer.toml",
                                              'version = 1\n[policy]\ndefault = "allow"\n'
                                              f'[unix]\nallow = ["{path}"]\n'))
    return bench.inet_passer


@pytest.mark.parametrize("python_only", [False, True], ids=["compiled", "python"])
@pytest.mark.parametrize("way_id", [w.id for w in INET_PASSED_WAYS])
def test_an_ip_socket_made_outside_and_passed_in_is_refused(bench, user, way_id, python_only):
    """The policy names the passer, a server outside that hands every client
    a TCP socket made outside. Connected inside, it would reach the world's
    listeners from the world's network namespace: refused (EPERM) on the
    compiled path and on the Python path alone, recorded; outside, the same
    attempt reaches the listener (the control)."""
    passer = _inet_passer(bench)
    bench.targets_for(user)["inet_passer"] = passer
    w = next(x for x in INET_PASSED_WAYS if x.id == way_id)
    results, events = bench.inside("inet-passed-in", user, INET_PASSED_PLAN,
                                   vpnw_args=("run", "--policy", bench.inet_passer_policy),
                                   env=PYTHON_PATH if python_only else None)
    res = results[w.id]
    assert not res["ok"], f"a way out: {w.id} worked inside the sandbox: {res}"
    assert errnos(res) <= w.accept, f"{w.id}: expected one of {sorted(w.accept)}, got {res}"
    denied = [e["fields"] for e in events if e["type"] == "unix.deny"]
    assert any(f["reason"] == "a socket made outside the sandbox" for f in denied), denied
    check_control(bench, user, "inet-passed-in", INET_PASSED_PLAN, w)

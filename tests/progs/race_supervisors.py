"""The supervisors of tests/test_supervisor_race.py, each over the program
tests/progs/unix_race.py under vpnw's own filter for the program.

    race_supervisors.py naive|vpnw DIR TRIES

`vpnw`: vpnw's supervisor, spawned as the helper spawns it
(stages/helper/supervisor/launch.py), answering by the compiled path or, with
VPNW_SUPERVISOR_PYTHON set, by the Python one. `naive`: a deliberately naive
one, on the same kernel plumbing (stages/kernel/seccomp_notify.py): it reads
the address, judges it by its path, and answers
SECCOMP_USER_NOTIF_FLAG_CONTINUE, so the kernel reads the address again; the
program then stops at the first connect that reached DIR/b.sock.
Run from outside the checkout, so that `stages` is the one installed (with
the compiled path, where it was built). Prints one JSON line: the program's
counts, the refusals the supervisor reported, and which path answered.
"""
import errno
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

from stages.helper import seccomp_rules
from stages.helper.supervisor import launch
from stages.helper.supervisor.judge import SOCKADDR_MAX, SYS_LISTEN
from stages.kernel import seccomp_notify as sn

PROGRAM = Path(__file__).resolve().parent / "unix_race.py"
DEADLINE = 60               # seconds for one program and its supervisor


def run_program(link: launch.SupervisorLink, directory: str, tries: int, until_beaten: bool) -> dict:
    """The program, forked: its filter loaded and the listener handed over
    (as the helper's program process does), then the race exec'd; its one
    JSON line, once it has ended."""
    bpf = seccomp_rules.filter_bpf(False, supervised=True)
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(out_r)
            os.dup2(out_w, 1)
            link.supervisor_end.close()
            launch.hand_over_listener(link.program_end.fileno(), bpf)
            os.execv(sys.executable, [sys.executable, str(PROGRAM), directory, str(tries),
                                      *(["--until-beaten"] if until_beaten else [])])
        finally:
            os._exit(127)
    os.close(out_w)
    link.program_end.close()
    with os.fdopen(out_r, "rb") as out:
        line = out.read()
    if reaped(pid) != 0:
        raise SystemExit(f"the program failed: {line!r}")
    return json.loads(line)


def reaped(pid: int) -> int:
    """The exit code of `pid`, killed after DEADLINE seconds."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def naive_supervisor(link: launch.SupervisorLink, allowed: bytes) -> int:
    """Check, then continue: its process's PID."""
    pid = os.fork()
    if pid:
        link.supervisor_end.close()
        os.close(link.proc_fd)
        return pid
    code = 1
    try:
        link.program_end.close()
        _msg, fds, _flags, _addr = socket.recv_fds(link.supervisor_end, 1, 1)
        listener, memory = fds[0], sn.MemoryReader(SOCKADDR_MAX)
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        # POLLHUP alone: no process uses the filter any more.
        while any(event & select.POLLIN for _fd, event in poller.poll()):
            try:
                n = sn.receive(listener)
            except OSError:
                continue            # the call ended before it was read
            answer = naive_answer(n, memory, allowed)
            try:
                if answer is None:
                    sn.go_on(listener, n.id)
                else:
                    sn.respond(listener, n.id, error=answer)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    raise
        code = 0
    finally:
        os._exit(code)


def naive_answer(n: sn.Notification, memory: sn.MemoryReader, allowed: bytes) -> int | None:
    """None: go on (the kernel makes the call itself, reading the address
    again); else the errno."""
    if n.nr == SYS_LISTEN:
        return None
    try:
        raw = memory.read(n.pid, n.args[1], min(n.args[2] & 0xFFFFFFFF, SOCKADDR_MAX))
    except OSError:
        return errno.EFAULT
    return None if raw[2:].split(b"\0", 1)[0] == allowed else errno.EPERM


def main(way: str, directory: str, tries: int) -> dict:
    link = launch.link()
    reports_r, reports_w = os.pipe()
    if way == "naive":
        supervisor = naive_supervisor(link, os.path.join(directory, "a.sock").encode())
    else:
        def report(r) -> None:      # in the supervisor's process, before the program hears
            os.write(reports_w, f"{r.path}\n".encode())
        supervisor = launch.spawn(link, [], reports_w, report)
    os.close(reports_w)
    counts = run_program(link, directory, tries, until_beaten=way == "naive")
    if reaped(supervisor) != 0:
        raise SystemExit("the supervisor failed")
    with os.fdopen(reports_r) as reports:
        refusals = reports.read().splitlines()
    return {"counts": counts, "refusals": refusals, "answered_by": launch.answered_by(),
            "stages": os.path.dirname(launch.__file__)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))), flush=True)

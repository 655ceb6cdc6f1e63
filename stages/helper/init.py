"""C, the sandbox's init (PID 1 of its PID namespace), forked by the seal
(P) once the namespaces are made: it makes the program's world (a fresh
/proc, the kernel's knobs read-only, the [files] limits or the held layer,
what runs outside later out of the program's reach, the terminal's
session), says InitOk or InitFailed to P, forks the program's process (G,
program.py), passes signals on to it, reaps every orphan, and reports the
program's end (stages/wire/status.py's INIT_REPORT)."""
from __future__ import annotations

import os
import signal

from stages.helper import file_mounts
from stages.helper.out_of_reach import out_of_program_reach, read_only_kernel_knobs
from stages.helper.processes import FORWARDED_SIGNALS, collect_from_now, decode_status, kill_quietly
from stages.helper.program import seal_and_exec
from stages.helper.terminal import lead_terminal_session
from stages.kernel import mounts
from stages.kernel import privileges as priv
from stages.kernel.descriptors import close_all_but
from stages.startup.trace import mark
from stages.wire import status as st
from stages.wire.exits import ExitCode

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:   # annotations only: the helper imports no policy code at run time
    from stages.config.file_limits import MountPlan
    from stages.config.protected import HelperProtection
    from stages.wire import helper_plan


def init_life(argv, penv, seccomp_bpf: bytes, report_w: int, go_r: int, keep: set[int],
              files: MountPlan | None = None, tty: bool = False,
              protected: HelperProtection | None = None, listener_end: int | None = None,
              held: helper_plan.HeldPlan | None = None) -> int:
    """Init's whole life; returns its exit code (the caller _exits with it)."""
    failed = _make_the_program_world(report_w, keep, files, tty, protected, held)
    if failed is not None:
        return failed
    st.write(report_w, st.InitOk())
    # The program's process is forked and sealed now, while the helper
    # reports ready and vpnw answers; it waits for go itself and then only
    # execs (docs/architecture.md, "The sandbox", 4). Before go nothing of
    # the program runs: go's EOF ends that process unexec'd.
    try:
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        program_pid = os.fork()
    except OSError as e:
        st.write(report_w, st.SandboxFailed(f"cannot start the program's process: {e}",
                                            ExitCode.INTERNAL))
        return ExitCode.INTERNAL
    if program_pid == 0:
        seal_and_exec(argv, penv, seccomp_bpf, err_w, go_r, files, tty, listener_end)  # never returns
    mark("init", "program forked")
    collect_from_now()
    os.close(err_w)
    os.close(go_r)
    if listener_end is not None:
        os.close(listener_end)
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, lambda s, _f: kill_quietly(program_pid, s))
    return _the_programs_end(program_pid, err_r, report_w, tty)


def _make_the_program_world(report_w: int, keep: set[int], files: MountPlan | None, tty: bool,
                            protected: HelperProtection | None,
                            held: helper_plan.HeldPlan | None) -> int | None:
    """Everything init makes before InitOk, in order; None, or the exit
    code once the failure is reported to P."""
    try:
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        # If the helper dies, init dies, and with PID 1 the whole namespace.
        priv.prctl(priv.PR_SET_PDEATHSIG, signal.SIGKILL)
        priv.prctl(priv.PR_SET_DUMPABLE, 0)
        close_all_but(keep)
        priv.mount("proc", "/proc", "proc", priv.MS_NOSUID | priv.MS_NODEV | priv.MS_NOEXEC)
        mark("init", "fresh /proc")
    except OSError as e:
        st.write(report_w, st.InitFailed(f"cannot set up the sandbox's init (fresh /proc): {e}"))
        return ExitCode.NO_SANDBOX
    try:
        read_only_kernel_knobs()
    except OSError as e:
        st.write(report_w, st.InitFailed(f"cannot make /proc/sys, /proc/irq, /proc/bus, /proc/fs and /sys "
                                              f"read-only or mask /proc/kcore and its kind: {e}"))
        return ExitCode.NO_SANDBOX
    mark("init", "kernel knobs read-only")
    try:
        _limit_files(files, held)
    except OSError as e:
        what = "make the run's held layer" if held else "enforce the policy's [files] limits"
        st.write(report_w, st.InitFailed(f"cannot {what}: {e}"))
        return ExitCode.NO_SANDBOX
    mark("init", "file limits")
    problem = out_of_program_reach(protected.read_only, protected.hide) if protected else None
    mark("init", "protected paths bound read-only")
    if problem:
        st.write(report_w, st.InitFailed(problem))
        return ExitCode.NO_SANDBOX
    if tty:
        try:
            lead_terminal_session()
        except OSError as e:
            st.write(report_w, st.SandboxFailed(f"cannot give the program its terminal: {e}",
                                                ExitCode.INTERNAL))
            return ExitCode.INTERNAL
    return None


def _the_programs_end(program_pid: int, err_r: int, report_w: int, tty: bool) -> int:
    """What the program's process said before exec (it could not), else its
    exit status, reported to P once it is reaped; returns init's exit code."""
    failure = b""
    while True:
        try:
            chunk = os.read(err_r, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        failure += chunk
    os.close(err_r)
    status = _wait_for(program_pid, report_w if tty else None)
    mark("init", "program reaped")
    if failure:
        try:
            report = st.decode(failure.rstrip(b"\n"), st.PROGRAM_REPORT)
        except st.StatusError:
            report = st.ExecFailed("the program could not be started", ExitCode.CANNOT_EXECUTE)
        st.write(report_w, report)
        return report.code
    code, sig = decode_status(status)
    st.write(report_w, st.Exited(code, sig))
    return code


def _limit_files(files: MountPlan | None, held: helper_plan.HeldPlan | None = None) -> None:
    """The policy's [files] table: a minimal /dev (root could otherwise read
    disks, consoles and serial lines: device files check the uid, not
    capabilities), then the mount layer (stages/helper/file_mounts.py).
    The held layer (stages/helper/held_layer.py): every run without [files],
    and one whose [files] says outside = "held" (its deny_read hidden after)."""
    # held_layer is imported here, in init's process alone, after the plan:
    # the seal (P) never needs it, and it brings the work set's planner.
    if files:
        mounts.minimal_dev()
        if held:
            from stages.helper import held_layer  # init's alone, after the plan (above)
            cwd = os.getcwd()
            held_layer.mount(held.dir, held.work, held.hide, held.anchors)
            file_mounts.hide(files.hide)
            os.chdir(cwd)    # a hidden cwd's old directory is below the new mount
        else:
            file_mounts.apply(files)
    elif held:
        from stages.helper import held_layer  # init's alone, after the plan (above)
        held_layer.mount(held.dir, held.work, held.hide, held.anchors)


def _wait_for(program_pid: int, stops_to: int | None = None) -> int:
    """Reap everything (we are PID 1) until the program itself ends. With
    `stops_to`, also report each time the program stops (Ctrl-Z on its pty),
    so vpnw can stop with it the way a shell job does."""
    flags = os.WUNTRACED if stops_to is not None else 0
    while True:
        try:
            pid, status = os.waitpid(-1, flags)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0
        if pid != program_pid:
            continue
        if os.WIFSTOPPED(status):
            st.write(stops_to, st.Stopped(os.WSTOPSIG(status)))
            continue
        return status


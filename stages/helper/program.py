"""G, the program's process, forked by init: sealed first (its own session
or the terminal's foreground, privileges dropped, Landlock, the seccomp
filter), then it waits for vpnw's go and only execs; it tells init why it
could not over a pipe of its own (stages/wire/status.py's PROGRAM_REPORT)."""
from __future__ import annotations

import errno
import os
import signal
import stat

from stages.helper import seccomp_rules
from stages.helper.processes import DOCTOR_HINT, FORWARDED_SIGNALS, go_byte
from stages.helper.supervisor.launch import hand_over_listener
from stages.helper.terminal import foreground_of_terminal
from stages.kernel import privileges as priv
from stages.kernel.descriptors import close_all_but
from stages.startup.trace import mark
from stages.wire import status as st
from stages.wire.exits import ExitCode

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:   # annotations only: the helper imports no policy code at run time
    from stages.config.file_limits import MountPlan


def seal_and_exec(argv, penv, seccomp_bpf: bytes, err_w: int, go_r: int,
                  files: MountPlan | None = None, tty: bool = False,
                  listener_end: int | None = None) -> None:
    """Sealed first (before go), then go read, then exec; never returns."""
    try:
        for sig in FORWARDED_SIGNALS + (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE; programs expect the default
        if tty:
            foreground_of_terminal()
        else:
            os.setsid()
        priv.prctl(priv.PR_SET_PDEATHSIG, signal.SIGKILL)
        close_all_but({err_w, go_r} if listener_end is None else {err_w, go_r, listener_end})
        priv.drop_all_privileges()
        if files and files.landlock_abi:
            # After no_new_privs (the drop), before the filter and exec.
            # Imported here, in the program's process alone: it loads ctypes.
            from stages.helper import landlock
            landlock.restrict_writes(files.writable, files.landlock_abi)
        if listener_end is None:
            seccomp_rules.load_bpf(seccomp_bpf)
        else:
            hand_over_listener(listener_end, seccomp_bpf)    # loads it, with its listener
    except BaseException as e:  # noqa: BLE001 - whatever went wrong, never exec unsealed
        _report_exec(err_w, st.SandboxFailed(f"cannot seal the program's process: {e}; "
                                             f"{DOCTOR_HINT}", ExitCode.NO_SANDBOX))
    mark("program", "sealed")
    if not go_byte(go_r):
        os._exit(ExitCode.NO_SANDBOX)   # vpnw gave up before go: nothing of the program ran
    os.close(go_r)
    try:
        mark("program", "go, exec")
        os.execve(_search_path(argv[0], penv.get("PATH")), argv, penv)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            code, what = ExitCode.NOT_FOUND, "not found"
        else:
            code, what = ExitCode.CANNOT_EXECUTE, "cannot be executed"
        _report_exec(err_w, st.ExecFailed(f"{argv[0]}: {what} ({e.strerror})", code))


def _search_path(name: str, path: str | None) -> str:
    """The file PATH finds for `name`, as the shell searches: a directory that
    cannot be searched holds nothing (not found, 127, not "Permission
    denied"); a file there that is not executable is used only when no
    executable one comes later (then 126). OSError(ENOENT) when none."""
    if "/" in name:
        return name
    first = None
    for directory in (os.defpath if path is None else path).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        try:
            if not stat.S_ISREG(os.stat(candidate).st_mode):
                continue
        except OSError:
            continue
        if os.access(candidate, os.X_OK):
            return candidate
        first = first or candidate
    if first:
        return first
    raise FileNotFoundError(errno.ENOENT, "No such file or directory", name)


def _report_exec(err_w: int, report: st.Message) -> None:
    try:
        st.write(err_w, report)
    finally:
        os._exit(report.code)

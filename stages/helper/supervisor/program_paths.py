"""A path the program's thread asks to connect to, found as that thread
would find it (from its root and working directory), by the supervisor,
which is outside the sandbox's PID namespace. `proc` is the supervisor's
/proc, the one from before init mounted the sandbox's."""
from __future__ import annotations

import errno
import os

from stages.helper.supervisor.program_threads import who
from stages.kernel import seccomp_notify as sn

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Callable


def open_in_root(proc: int, tid: int, path: bytes) -> int:
    """An O_PATH fd of `path` as the program's thread would find it: from
    its root (RESOLVE_IN_ROOT on /proc/TID/root, which also refuses
    /proc's magic links with EXDEV), relative paths from its working
    directory."""
    if not path.startswith(b"/"):
        cwd = os.readlink(f"{tid}/cwd", dir_fd=proc)
        if not cwd.startswith("/"):
            raise OSError(errno.ENOENT, "the working directory is out of reach")
        path = cwd.encode().rstrip(b"/") + b"/" + path
    path = proc_self(path, lambda: who(proc, tid)[0])
    root = os.open(f"{tid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
    try:
        for _ in range(4):
            try:
                return sn.openat2(root, path, os.O_PATH | os.O_CLOEXEC, sn.RESOLVE_IN_ROOT)
            except OSError as e:
                if e.errno == errno.ENOENT and leads_through_proc_self(
                        path, lambda prefix: _link_in_root(root, prefix)):
                    # A symlink into /proc/self: for us (outside the PID
                    # namespace) "self" is nothing, for the program its
                    # own magic links. Refused and recorded as those are.
                    raise OSError(errno.EXDEV, "a symlink into /proc/self") from None
                if e.errno != errno.EAGAIN:     # a rename raced the lookup: again
                    raise
        raise OSError(errno.EAGAIN, "the path kept changing")
    finally:
        os.close(root)


def proc_self(path: bytes, thread_pid: Callable[[], int]) -> bytes:
    """/proc/self and /proc/thread-self name the asking thread inside the
    sandbox's /proc, but nothing for us (we are outside its PID
    namespace): spelled with the thread's own PID (`thread_pid()`, 0 when
    it cannot be told), the lookup meets the magic link behind them and is
    refused as such (EXDEV), and recorded."""
    parts = [p for p in path.split(b"/") if p not in (b"", b".")]
    while parts[:1] == [b".."]:
        del parts[0]            # ".." at the root is the root (RESOLVE_IN_ROOT too)
    if len(parts) < 2 or parts[0] != b"proc" or parts[1] not in (b"self", b"thread-self"):
        return path
    pid = thread_pid()
    if not pid:
        return path
    return b"/".join([b"", b"proc", str(pid).encode(), *parts[2:]])


PROC_SELF_NAMES = (b"self", b"thread-self")
MAXSYMLINKS = 40                # the kernel's limit on links followed in one lookup


def leads_through_proc_self(path: bytes, readlink: Callable[[bytes], bytes | None]) -> bool:
    """Pure: does the absolute `path`, its symlinks followed as the kernel
    follows them (RESOLVE_IN_ROOT: ".." stops at the root), pass through
    /proc/self or /proc/thread-self? `readlink(prefix)` gives the target of
    the symlink at `prefix` (an absolute path with no symlink left in it), or
    None when it is no symlink (or nothing)."""
    done: list[bytes] = []
    todo = [part for part in path.split(b"/") if part]
    links = 0
    while todo:
        part = todo.pop(0)
        if part == b".":
            continue
        if part == b"..":
            if done:
                done.pop()
            continue
        if done == [b"proc"] and part in PROC_SELF_NAMES:
            return True
        target = readlink(b"/" + b"/".join([*done, part]))
        if target is None:
            done.append(part)
            continue
        links += 1
        if links > MAXSYMLINKS:
            return False
        if target.startswith(b"/"):
            done = []
        todo[:0] = [part for part in target.split(b"/") if part]
    return False


def _link_in_root(root: int, path: bytes) -> bytes | None:
    """The target of the symlink at `path` under `root`, or None."""
    try:
        fd = sn.openat2(root, path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, sn.RESOLVE_IN_ROOT)
    except OSError:
        return None
    try:
        return os.readlink(b"", dir_fd=fd)
    except OSError:
        return None         # EINVAL: no symlink
    finally:
        os.close(fd)

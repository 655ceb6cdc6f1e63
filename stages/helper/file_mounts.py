"""The mount layer of file limits, applied by init in the sandbox's own mount
namespace before the program exists (stages/config/file_limits.py says what the
paths mean; this module only mounts).

    1. allow_write: every mount read-only (a bind remount that keeps the flags
       the kernel locked on mounts inherited from the caller's namespace),
       then each writable path bound onto itself and made writable again when
       the mount it lies on was writable to begin with. /dev/shm becomes a
       private tmpfs of the sandbox's own (shared memory keeps working;
       nothing written there reaches the host). Our fresh /proc stays as it is.
    2. deny_read: over each directory an empty directory, over each file an
       empty file, both bound from one private read-only tmpfs (one
       superblock for all: a bind costs ~5 us, a new tmpfs 15-80). That tmpfs
       is staged over /dev for a moment and detached once bound. The targets
       are opened first (O_PATH) and mounted on through /proc/self/fd, so the
       staging mount cannot shadow them.
    3. chdir to where we were: the old cwd still points into the mounts below
       the new ones (a writable "." would stay read-only for relative paths).

Root inside gets the same limits: the program's privileges are dropped
before exec (no CAP_SYS_ADMIN left to umount or remount anything) and the
seccomp filter refuses a new user namespace to get one back.
"""
from __future__ import annotations

import errno
import os
TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing (~4 ms)

from stages.kernel import privileges as priv
from stages.kernel.mounts import (
    KEPT_FLAGS as _KEPT_FLAGS, MS_BIND as _MS_BIND, MS_RDONLY as _MS_RDONLY, MS_REMOUNT as
    _MS_REMOUNT, mount_points_under as _mount_points_under,
)

if TYPE_CHECKING:   # annotations only: the helper imports no policy code at run time
    from stages.config.file_limits import MountPlan

_ST_RDONLY = 1
_HIDDEN = priv.MS_NOSUID | priv.MS_NODEV | priv.MS_NOEXEC
_STAGING = "/dev"


def apply(plan: MountPlan) -> None:
    """Raises OSError (the sandbox is then not built)."""
    cwd = os.getcwd()
    if plan.limit_writes:
        _read_only_except(plan.writable)
    hide(plan.hide)
    os.chdir(cwd)


# nosymfollow too (Linux 5.10): locked like the others on an inherited mount.
_ST_NOSYMFOLLOW, _MS_NOSYMFOLLOW = 0x2000, 256


def _kept(point: str) -> int:
    flags = os.statvfs(point).f_flag
    kept = sum(ms for st, ms in _KEPT_FLAGS if flags & st)
    return kept | (_MS_NOSYMFOLLOW if flags & _ST_NOSYMFOLLOW else 0)


def _remount(point: str, read_only: bool) -> None:
    priv.mount(None, point, None, _MS_BIND | _MS_REMOUNT | _kept(point)
               | (_MS_RDONLY if read_only else 0))


def _read_only_except(writable: list[list[str]]) -> None:
    was_writable: dict[str, bool] = {}
    for point in dict.fromkeys(_mount_points_under("/")):
        if point == "/proc" or point.startswith("/proc/"):
            continue
        try:
            flags = os.statvfs(point).f_flag
        except OSError as e:
            # A mount point this user cannot reach (below a directory it may
            # not enter) is as out of reach for the program, which runs as the
            # same user without capabilities.
            if e.errno in (errno.EACCES, errno.ENOENT, errno.ENOTDIR):
                continue
            raise
        was_writable[point] = not flags & _ST_RDONLY
        if was_writable[point]:
            _remount(point, read_only=True)
    if os.path.isdir("/dev/shm"):
        priv.mount("tmpfs", "/dev/shm", "tmpfs", priv.MS_NOSUID | priv.MS_NODEV, "mode=1777")
    for path, _kind in writable:
        priv.mount(path, path, None, _MS_BIND | priv.MS_REC)
        # The recursive bind made a mount at `path` and a copy of every mount
        # below it: the same points as before (mountinfo is read only once).
        below = [p for p in was_writable if path == p or path.startswith(p.rstrip("/") + "/")]
        if (was_writable[max(below, key=len)] if below else False):
            _remount(path, read_only=False)
        for point, writable_before in was_writable.items():
            if writable_before and point.startswith(path.rstrip("/") + "/"):
                _remount(point, read_only=False)


def hide(hide: list[list[str]]) -> None:
    """An empty read-only file or directory over each [path, kind] this user can reach."""
    targets = []
    try:
        for path, kind in hide:
            try:
                fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            except PermissionError:
                continue   # unreachable for this user, so for the program too
            targets.append((path, kind, fd))
        if targets:
            _bind_empties(targets)
    finally:
        for _path, _kind, fd in targets:
            os.close(fd)


def _bind_empties(targets: list[tuple[str, str, int]]) -> None:
    """Bind an empty directory or file over each target, from one read-only
    tmpfs. The tmpfs is staged on the first denied directory and left there
    under its own empty directory; only when no directory is denied is it
    staged over /dev and detached afterwards (an umount waits for an RCU
    grace period: up to several ms)."""
    dirs = [t for t in targets if t[1] == "dir"]
    if dirs:
        base, _kind, base_fd = dirs[0]
        priv.mount("tmpfs", f"/proc/self/fd/{base_fd}", "tmpfs", _HIDDEN, "mode=0555,size=4k,nr_inodes=4")
        rest = [t for t in targets if t is not dirs[0]]
    else:
        base = _STAGING
        priv.mount("tmpfs", base, "tmpfs", _HIDDEN, "mode=0555,size=4k,nr_inodes=4")
        rest = targets
    try:
        empty_file = os.path.join(base, "file")
        empty_dir = os.path.join(base, "dir")
        os.close(os.open(empty_file, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o444))
        os.mkdir(empty_dir, 0o555)
        os.chmod(empty_dir, 0o555)     # whatever the umask
        priv.mount(None, base, None, _MS_REMOUNT | _MS_RDONLY | _HIDDEN)
        # The remount above made the tmpfs read-only twice over (its superblock
        # and its mount); a bind copies the mount's flags, so each is read-only,
        # nosuid, nodev and noexec as made, with no remount of its own.
        for _path, kind, fd in rest:
            priv.mount(empty_dir if kind == "dir" else empty_file, f"/proc/self/fd/{fd}", None, _MS_BIND)
        if dirs:
            priv.mount(empty_dir, base, None, _MS_BIND)   # on top of the staging tmpfs
    finally:
        if not dirs:
            priv.umount(_STAGING, priv.MNT_DETACH)

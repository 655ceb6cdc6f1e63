"""The held layer, mounted by init in the sandbox's own mount namespace
before the program exists (stages/config/work_set.py decides what;
docs/architecture.md, "The held layer", says why it is built this way).

    1. Everything is opened first (O_PATH): each directory to overlay, each
       work set path, the run's held directory. Once an overlay covers a
       directory, a path through it names the overlay, not the real thing
       (an upper directory under an overlaid home would be refused).
    2. Each target directory gets an overlay: lower = itself, upper and
       work = held/<run-id>/layers/<n>/{upper,work}, `userxattr` (the
       unprivileged form, Linux >= 5.11), `volatile` (when the namespace
       ends, each overlay would otherwise sync the whole file system its
       upper lies on: on a busy disk, hundreds of ms at the end of every
       run; what is held is not worth a sync). One that cannot be mounted
       is bound read-only instead (never left writable).
    3. The work set is bound back, real (recursive binds of what was opened
       in 1), before 4, so its binds keep the flags they had.
    4. The mounts split around the mounts below them are made read-only,
       and the kernel's file systems outside /proc, /sys and /dev too.
    5. held/ itself is hidden (an empty directory over it).
    6. layers.json, and `not-held` when some or all of it fell back to
       read-only: the orchestrator reads both after the run.
"""
from __future__ import annotations

import errno
import os
# json's C half, as stages/wire/status.py uses it: the json package loads
# `re` (docs/architecture.md, "Start-up budget"), and init is on the way to Ready.
from stages.startup.json_c import encode_basestring

from stages.config.work_set import layer_plan, mount_table
# Imported before the layer: a module first imported after it would leave
# its bytecode cache in the layer as the run's own write.
from stages.helper import file_mounts
from stages.kernel import privileges as priv
from stages.kernel.mounts import KEPT_FLAGS, MS_BIND, MS_RDONLY, MS_REMOUNT

_ST_NOSYMFOLLOW, _MS_NOSYMFOLLOW = 0x2000, 256


def _kept_fd(fd: int) -> int:
    flags = os.fstatvfs(fd).f_flag
    kept = sum(ms for st, ms in KEPT_FLAGS if flags & st)
    return kept | (_MS_NOSYMFOLLOW if flags & _ST_NOSYMFOLLOW else 0)


def _read_only(path: str) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        kept = _kept_fd(fd)
    finally:
        os.close(fd)
    priv.mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | kept)


def _entries(directory: str) -> list[tuple[str, bool]]:
    try:
        with os.scandir(directory) as it:
            return [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    except OSError:
        return []     # unreadable: its entries stay on the read-only mount


def _open_path(path: str) -> int | None:
    try:
        return os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None   # not there, or unreachable for this user: so for the program too


def _fits(directory: str) -> bool:
    """An overlay may be rooted here: the directory is this user's own (uid
    and gid: copy-up keeps both) or writable by them (/var/tmp)."""
    try:
        st = os.stat(directory, follow_symlinks=False)
    except OSError:
        return False
    return (st.st_uid == os.getuid() and st.st_gid == os.getgid()) or os.access(directory, os.W_OK)


def mount(held_dir: str, work: tuple[str, ...], hide_root: str, anchors: tuple[str, ...] = ()) -> None:
    """Raises OSError when the layer cannot be made safe (the sandbox is then not built)."""
    cwd = os.getcwd()
    with open("/proc/self/mountinfo") as f:
        plan = layer_plan(mount_table(f.read()), tuple(work), _entries, anchors=tuple(anchors),
                          fits=_fits)
    dir_fd = os.open(held_dir, os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    opened: list[int] = [dir_fd]
    try:
        work_fds = []
        for path in work:
            fd = _open_path(path)
            if fd is not None:
                opened.append(fd)
                work_fds.append((path, fd))
        os.mkdir("layers", 0o700, dir_fd=dir_fd)
        layers_fd = os.open("layers", os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
        opened.append(layers_fd)
        mounted, refused = _overlays(plan.targets, layers_fd, opened)
        # Written before 4: the held directory may lie on a mount made read-only there.
        _write(dir_fd, "layers.json", _layers_json(mounted))
        if refused:
            _write(dir_fd, "not-held", "".join(f"{path}\t{why}\n" for path, why in refused))
        for path, fd in work_fds:
            priv.mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | priv.MS_REC)
        for point in plan.read_only:
            try:
                _read_only(point)
            except PermissionError:
                pass    # below a directory this user cannot enter: as out of the program's reach
    finally:
        for fd in opened:
            os.close(fd)
    _hide(hide_root)
    os.chdir(cwd)


def _overlays(targets, layers_fd: int, opened: list[int]):
    """(the (target, upper) mounted, the (target, why) bound read-only instead)."""
    mounted: list[tuple[str, str]] = []
    refused: list[tuple[str, str]] = []
    for n, target in enumerate(targets):
        tfd = _open_path(target)
        if tfd is None:
            continue
        opened.append(tfd)
        try:
            os.mkdir(str(n), 0o700, dir_fd=layers_fd)
            for part in ("upper", "work"):
                os.mkdir(f"{n}/{part}", 0o700, dir_fd=layers_fd)
            ufd = os.open(f"{n}/upper", os.O_PATH | os.O_CLOEXEC, dir_fd=layers_fd)
            opened.append(ufd)
            wfd = os.open(f"{n}/work", os.O_PATH | os.O_CLOEXEC, dir_fd=layers_fd)
            opened.append(wfd)
            priv.mount("overlay", f"/proc/self/fd/{tfd}", "overlay", _kept_fd(tfd),
                       f"lowerdir=/proc/self/fd/{tfd},upperdir=/proc/self/fd/{ufd},"
                       f"workdir=/proc/self/fd/{wfd},userxattr,volatile")
            mounted.append((target, f"layers/{n}/upper"))
        except OSError as e:
            refused.append((target, errno.errorcode.get(e.errno, str(e.errno))))
            # Never left writable: bound onto itself, read-only.
            priv.mount(f"/proc/self/fd/{tfd}", target, None, MS_BIND)
            _read_only(target)
    return mounted, refused


def _layers_json(mounted) -> str:
    """[{"mount": ..., "upper": ...}, ...] as json.dumps(ensure_ascii=False) writes it."""
    items = [f'{{"mount": {encode_basestring(target)}, "upper": {encode_basestring(upper)}}}'
             for target, upper in mounted]
    return "[" + ", ".join(items) + "]\n"


def _write(dir_fd: int, name: str, text: str) -> None:
    tmp = f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, text.encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _hide(hide_root: str) -> None:
    """vpnw's held layers, of this run and of others: an empty directory over them."""
    file_mounts.hide([(hide_root, "dir")])

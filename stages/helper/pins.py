"""Pins: what runs outside later can be neither changed nor moved
(docs/security.md, "Pinned: nothing moved aside"; docs/architecture.md, "Pins").

A protected path is bound read-only onto itself (out_of_reach.py), so the program
cannot write it; but the kernel lets a process rename a directory that merely
contains a mount point, and the mount moves with it: `mv .git .git.old; mkdir
.git` leaves the read-only `hooks` under `.git.old` and git reads the new
ones. A mount point itself cannot be renamed, removed or renamed over
(vfs_rename and vfs_rmdir: EBUSY when the dentry is a mount point in the
caller's mount namespace, whichever mount the name is reached through). So
each directory above a protected path, up to `/`, becomes a mount point
(those that are not one already): bound onto itself, recursively (the mounts below, read-only ones
included, are copied with their flags), outermost first, before the
protected paths' own read-only binds. A bind copies its mount's flags: a
writable directory stays writable, a read-only one read-only; only its name
is fixed.

    ancestors_to_pin(paths, mount_points) -> the directories to bind (pure; the
                                             orchestrator records their inodes too)
    pin(paths) -> how many were bound       (init, in the sandbox's namespace)
"""
from __future__ import annotations

import os


def ancestors_to_pin(paths, mount_points) -> list[str]:
    """The directories above `paths`, up to `/`, that are not mount points
    already, outermost first: what must become a mount point for no rename
    to move a path. The walk goes past a mount point (the work set's root,
    a mount of the machine's) on up: a mount point cannot be renamed itself,
    but it moves with a renamed directory above it (root inside could `mv
    /home /x` and take the mount at /home/me along)."""
    points = set(mount_points)
    seen: set[str] = set()
    for path in paths:
        here = os.path.dirname(path.rstrip("/") or "/")
        while here != "/" and here not in seen:
            seen.add(here)
            here = os.path.dirname(here)
    return sorted((d for d in seen if d not in points), key=lambda p: (p.count("/"), p))


def pin(paths) -> list[str]:
    """Bind each directory ancestors_to_pin names onto itself, recursively,
    outermost first. One this user cannot reach (below a directory it may
    not enter) is as out of the program's reach: skipped. Returns the
    directories bound. Raises OSError."""
    # Here, not at the top: the orchestrator imports ancestors_to_pin, and
    # these bring _ctypes into it before the recorder is forked.
    from stages.kernel import privileges as priv
    from stages.kernel.mounts import MS_BIND, mount_points_under  # (the same reason)
    bound = []
    for directory in ancestors_to_pin(paths, mount_points_under("/")):
        try:
            priv.mount(directory, directory, None, MS_BIND | priv.MS_REC)
        except PermissionError:
            continue
        except FileNotFoundError:
            continue   # below a hidden (deny_read) directory: not there to move
        bound.append(directory)
    return bound


def unpinned(paths) -> list[str]:
    """The seal check: which of `paths` (the protected paths and the
    directories pinned above them) are not mount points now."""
    from stages.kernel.mounts import mount_points_under  # here, not at the top: as in pin()
    points = set(mount_points_under("/"))
    return [p for p in paths if p not in points]

"""Pins: what runs outside later can be neither changed nor moved
(docs/security.md, "Pinned: nothing moved aside"; docs/architecture.md, "Pins").

A protected path is bound read-only onto itself (sandbox.py), so the program
cannot write it; but the kernel lets a process rename a directory that merely
contains a mount point, and the mount moves with it: `mv .git .git.old; mkdir
.git` leaves the read-only `hooks` under `.git.old` and git reads the new
ones. A mount point itself cannot be renamed, removed or renamed over
(vfs_rename and vfs_rmdir: EBUSY when the dentry is a mount point in the
caller's mount namespace, whichever mount the name is reached through). So
each directory between a protected path and the nearest mount above it
(the work set's root, or the file system's) becomes a mount point of its
own: bound onto itself, recursively (the mounts below, read-only ones
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

from stages.kernel import privileges as priv
from stages.kernel.mounts import MS_BIND, mount_points_under


def ancestors_to_pin(paths, mount_points) -> list[str]:
    """The directories above `paths` up to (not including) the nearest mount
    point above each, outermost first: what must become a mount point for no
    rename to move a path. The walk starts at each path's parent whether or
    not the path is a mount point itself: a mount moves with a renamed
    directory above it. A mount point above stops it: it cannot be renamed."""
    points = set(mount_points)
    out: dict[str, None] = {}
    for path in paths:
        here = os.path.dirname(path.rstrip("/") or "/")
        while here not in points and here != "/" and here not in out:
            out[here] = None
            here = os.path.dirname(here)
    return sorted(out, key=lambda p: (p.count("/"), p))


def pin(paths) -> list[str]:
    """Bind each directory ancestors_to_pin names onto itself, recursively,
    outermost first. One this user cannot reach (below a directory it may
    not enter) is as out of the program's reach: skipped. Returns the
    directories bound. Raises OSError."""
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
    points = set(mount_points_under("/"))
    return [p for p in paths if p not in points]

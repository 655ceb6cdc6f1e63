"""The look-ups about this machine that the protection (protected.py) and
the [files] limits (file_limits.py) make: where a path really is, and whose
home `~` means. Apart from file_limits so that a run without [files] does
not load that module (its dataclasses) before the sandbox is forked."""
from __future__ import annotations

import os
import pwd
import stat


def locate(path: str) -> tuple[str, str]:
    """(realpath, kind) of an absolute path. An existing path is opened
    (O_PATH) and named by the kernel: 3 system calls, where os.path.realpath
    makes one lstat per component."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError, PermissionError, OSError):
        # Not there, or not reachable by this user (so not by the program,
        # which runs as the same user without capabilities).
        return os.path.realpath(path), "absent"
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
        mode = os.fstat(fd).st_mode
    except OSError:
        return os.path.realpath(path), "absent"
    finally:
        os.close(fd)
    if not real.startswith("/"):          # no /proc here, or not a path (anon inode)
        real = os.path.realpath(path)
    return real, "dir" if stat.S_ISDIR(mode) else "file"


def invoker_homes(env: dict[str, str], uid: int | None = None) -> tuple[str, tuple[str, ...]]:
    """(the home `~` means, other homes deny_read's `~` covers too)."""
    uid = os.getuid() if uid is None else uid
    home = env.get("HOME", "")
    if not home.startswith("/"):
        try:
            home = pwd.getpwuid(uid).pw_dir
        except KeyError:
            home = "/"
    others: list[str] = []
    sudo_user = env.get("SUDO_USER")
    if uid == 0 and sudo_user and sudo_user != "root":
        try:
            other = pwd.getpwnam(sudo_user).pw_dir
        except KeyError:
            other = ""
        if other.startswith("/") and os.path.normpath(other) != os.path.normpath(home):
            others.append(other)
    return home, tuple(others)

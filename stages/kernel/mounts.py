"""Mount primitives the helper's seal, its [files] mounts and `vpnw doctor`
share: bind read-only keeping the flags the kernel locked, the mount points
under a directory, a devpts of the sandbox's own."""
from __future__ import annotations

import os

from stages.kernel import privileges as priv
from stages.kernel.mountinfo import unescape

MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
# statvfs f_flag bit -> the mount flag that keeps it (a remount must keep the
# flags the kernel locked on mounts inherited from the caller's namespace).
KEPT_FLAGS = ((2, priv.MS_NOSUID), (4, priv.MS_NODEV), (8, priv.MS_NOEXEC), (16, 16),
              (1024, 1024), (2048, 2048), (4096, 1 << 21))


def mount_points_under(top: str) -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = unescape(line.split()[4])
            if point == top or point.startswith(top.rstrip("/") + "/"):
                points.append(point)
    return points


def read_only(point: str) -> None:
    flags = os.statvfs(point).f_flag
    keep = sum(ms for st, ms in KEPT_FLAGS if flags & st)
    priv.mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep)


def mount_fresh_devpts() -> None:
    """A devpts instance of the sandbox's own over /dev/pts: the user's
    terminals (/dev/pts/N, owned by the user, so otherwise open to a program
    running as the user: its keys to read, its screen to write) are not
    there to open by name; /dev/ptmx makes new ptys in this instance (tmux,
    script, node-pty inside work). Raises OSError."""
    priv.mount("devpts", "/dev/pts", "devpts", priv.MS_NOSUID | priv.MS_NOEXEC,
               "newinstance,mode=0620,ptmxmode=0666")


# The devices a program needs, as bubblewrap's --dev gives them: each bound
# from the machine's /dev; everything else (disks, consoles, vcs, serial
# lines, loop devices, kmsg) is not there to open.
MINIMAL_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
MINIMAL_LINKS = {"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
                 "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}


def minimal_dev() -> None:
    """A fresh /dev: a tmpfs with MINIMAL_DEVICES bound in, the devpts
    already at /dev/pts (the sandbox's own, moved across), an empty
    writable /dev/shm and the usual links; read-only but for /dev/shm.
    Raises OSError."""
    sources = {}
    try:
        for name in (*MINIMAL_DEVICES, "pts"):
            try:
                sources[name] = os.open(f"/dev/{name}", os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                if name == "pts":
                    raise
        priv.mount("tmpfs", "/dev", "tmpfs", priv.MS_NOSUID | priv.MS_NOEXEC,
                   "mode=0755,size=64k,nr_inodes=64")
        for name in sources:
            if name == "pts":
                os.mkdir("/dev/pts", 0o755)
            else:
                os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666))
            priv.mount(f"/proc/self/fd/{sources[name]}", f"/dev/{name}", None,
                       MS_BIND | priv.MS_REC)
        for name, target in MINIMAL_LINKS.items():
            os.symlink(target, f"/dev/{name}")
        os.mkdir("/dev/shm", 0o1777)
        os.chmod("/dev/shm", 0o1777)
        priv.mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | priv.MS_NOSUID | priv.MS_NOEXEC)
        priv.mount("tmpfs", "/dev/shm", "tmpfs", priv.MS_NOSUID | priv.MS_NODEV, "mode=1777")
    finally:
        for fd in sources.values():
            os.close(fd)

"""What init puts out of the program's reach before InitOk: the kernel's
knobs that check the uid rather than capabilities (sysctls, sysrq, sysfs,
Docker's read-only and masked /proc and /sys paths), and what runs outside
the sandbox later and the record (stages/config/protected.py), bound
read-only, pinned where they are, with the config's secrets hidden; each
checked through the path the program will use."""
from __future__ import annotations

import bisect
import os

from stages.helper import file_mounts, pins
from stages.kernel import mounts
from stages.kernel import privileges as priv


def read_only_kernel_knobs() -> None:
    """Sysctls, sysrq and sysfs check the uid (0 = the machine's root), not
    capabilities: a program run as root would keep writing them after the
    drop, e.g. kernel.core_pattern = "|prog", which the kernel then runs as
    root outside every namespace. Read-only bind mounts close that."""
    for knob in ("/proc/sys", "/proc/sysrq-trigger"):
        if os.path.exists(knob):
            priv.mount(knob, knob, None, mounts.MS_BIND | priv.MS_REC)
    for point in ["/proc/sys", "/proc/sysrq-trigger", *mounts.mount_points_under("/sys")]:
        if os.path.exists(point):
            mounts.read_only(point)
    _docker_default_proc_masks()


# Docker's defaults (moby oci/defaults.go, DefaultLinuxSpec): readonlyPaths
# (/proc/sys and /proc/sysrq-trigger are done above) and maskedPaths, plus
# /sys/devices/virtual/powercap, which newer moby and containerd mask too
# (RAPL energy counters, CVE-2020-8694). These files check the uid, or
# nothing at all (PCI config space), not capabilities: root inside could
# write /proc/irq/*/smp_affinity or a device's config space, or read the
# kernel's memory image, timers and keys.
DOCKER_READ_ONLY = ("/proc/bus", "/proc/fs", "/proc/irq")
DOCKER_MASKED = ("/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                 "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
                 "/sys/firmware", "/sys/devices/virtual/powercap")


def _docker_default_proc_masks() -> None:
    for top in DOCKER_READ_ONLY:
        if os.path.exists(top):
            priv.mount(top, top, None, mounts.MS_BIND | priv.MS_REC)
            for point in mounts.mount_points_under(top):
                mounts.read_only(point)
    for point in DOCKER_MASKED:
        if os.path.isdir(point):
            # An empty read-only tmpfs, as runc masks a directory.
            priv.mount("tmpfs", point, "tmpfs",
                       mounts.MS_RDONLY | priv.MS_NOSUID | priv.MS_NODEV | priv.MS_NOEXEC)
        elif os.path.exists(point):
            priv.mount("/dev/null", point, None, mounts.MS_BIND)


def out_of_program_reach(paths: list[str], secrets: list[list[str]] = ()) -> str | None:
    """What runs outside the sandbox later (stages/config/protected.py) and the
    record, which is evidence (docs/security.md): vpnw's installation, its
    state directory, the record, the policy and the config, the shell's and
    git's start-up files... are read-only in the program's mount namespace,
    and the secret files the config names are hidden (an empty file or
    directory over them). Done last, after the file limits, so that no
    allow_write can make them writable again (a policy lifts one only by
    naming it: the orchestrator then leaves it out). Each is bound onto
    itself and remounted read-only (the program has no CAP_SYS_ADMIN to undo
    it, and no new user namespace to get one); the seal check is statvfs's
    ST_RDONLY through the path the program will use. None, or why not."""
    cwd = os.getcwd()
    try:
        pinned = _pin_above(paths)
        # Sorted once: the mount points below a path are one run of them
        # (bisect; a scan of every point for every path was quadratic: ~0.1 s
        # at 700 paths). No protected path lies below another (protected.py's
        # _outermost), so the binds made here add none below a later one.
        points = sorted(set(mounts.mount_points_under("/")))
        for path in paths:
            try:
                real = os.path.realpath(path, strict=True)
            except (FileNotFoundError, NotADirectoryError):
                continue   # hidden by a deny_read limit: out of reach already
            except PermissionError:
                continue   # unreachable for this user, so for the program too
            priv.mount(real, real, None, mounts.MS_BIND | priv.MS_REC)
            for point in [real, *_points_below(points, real)]:
                try:
                    mounts.read_only(point)
                except PermissionError:
                    pass   # below a directory this user cannot enter
        if secrets:
            file_mounts.hide(secrets)
        # A cwd inside a protected directory still points at the mount below.
        os.chdir(cwd)
        problem = _still_shown(secrets) or _not_pinned(paths, pinned)
        if problem:
            return problem
        for path in paths:
            try:
                writable = not os.statvfs(path).f_flag & _ST_RDONLY
            except OSError:
                continue
            if writable:
                return f"{path} is still writable after its read-only bind"
    except OSError as e:
        return (f"cannot make vpnw's installation and evidence, and the files that run "
                f"outside the sandbox later, read-only for the program: {e}")
    return None


_ST_RDONLY = 1


def _points_below(points: list[str], top: str) -> list[str]:
    """The mount points strictly below `top` in the sorted `points`."""
    prefix = top.rstrip("/") + "/"
    out = []
    for point in points[bisect.bisect_left(points, prefix):]:
        if not point.startswith(prefix):
            break
        out.append(point)
    return out


def _pin_above(paths: list[str]) -> list[str]:
    """Each directory above a protected path, up to `/`, made a mount point
    (those not one already), so that no rename moves the path
    (stages/helper/pins.py). Before the read-only binds: their mounts are
    then made once, on top, not copied by each pin."""
    return pins.pin(paths)


def _not_pinned(paths: list[str], pinned: list[str]) -> str | None:
    """The pins' seal check: each protected path there and each directory
    pinned above it is a mount point in the program's namespace."""
    there = [p for p in paths if os.path.lexists(p)]
    loose = pins.unpinned([*pinned, *there])
    if loose:
        return f"{loose[0]} is not a mount point after its pin: a rename could move it"
    return None


def _still_shown(hidden: list[list[str]]) -> str | None:
    """The seal check of what is hidden (a secret the config names, vpnw's
    signing key): through the path the program will use, an empty directory
    or an empty file."""
    for path, kind in hidden:
        try:
            shown = os.listdir(path) if kind == "dir" else os.stat(path).st_size
        except FileNotFoundError:
            continue
        if shown:
            return f"{path} still shows what it holds after its empty mount"
    return None


"""The work set and the held layer, decided (docs/security.md, "The work set
and the held layer"; docs/architecture.md, "The held layer").

    work_set(cwd, home, ...)      ->  WorkSet: where the program writes for real
    mount_table(mountinfo text)   ->  [Mount]: the sandbox's mounts, as init sees them
    layer_plan(mounts, work, ...) ->  LayerPlan: the directories that get an overlay of
                                      their own, and the mounts made read-only
    runs_later(path, ...)         ->  what a held path would run on its own later
    held_line(entries, run_id)    ->  the one line said at the end of a run

A run writes for real only in its work set: the directory it starts in
(never `/`, the home directory or an ancestor of it), the policy's
allow_write paths and /tmp. Everything else the invoker can write becomes,
in the run's own mount namespace, an overlay whose upper directory lies in
vpnw's state (held/<run-id>/), out of the program's reach: the program sees
its own writes, the real files never change.

Why directories and not mounts: an overlay's lower layer is a private clone
of a mount, and the kernel refuses that clone (EINVAL) for a mount with
locked mounts below it (every mount inherited into a new user namespace is
locked to its parent). So a mount with no mounts below it gets one overlay
over all of it; a mount with mounts below it (`/`, with /proc, /dev...) is
split: each directory on the way down to a mount below (its "spine") stays
the real mount, made read-only, and every other directory in those spine
directories gets an overlay of its own. Files directly in a spine directory
(rare: `/` holds none but links) are then read-only, never writable.

Pure but for what it is given, so the tests can pass a file system of their own.
"""
from __future__ import annotations

import os

from stages.kernel.mountinfo import unescape
from stages.startup.records import NamedTuple  # typing's, without importing typing

# Left as they are (docs/security.md): the sandbox's own /proc, the
# machine's /sys (read-only already) and /dev.
KEPT_TOPS = ("/proc", "/sys", "/dev")
# Kernel file systems that hold no one's files: made read-only, never overlaid.
KERNEL_FS = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "mqueue", "bpf", "tracefs",
    "debugfs", "securityfs", "pstore", "configfs", "fusectl", "binfmt_misc", "nsfs", "autofs",
    "efivarfs", "hugetlbfs", "rpc_pipefs", "selinuxfs", "ramfs"})

# [files] outside = ...: what writes outside allow_write meet.
OUTSIDE_VALUES = ("read-only", "held")


class WorkSet(NamedTuple):
    """Where the program writes for real, and what was left out of it and why."""
    paths: tuple[str, ...]          # absolute, symlinks resolved, none inside another
    left_out: tuple[str, ...] = ()  # one start line each


def within(path: str, top: str) -> bool:
    return path == top or top == "/" or path.startswith(top.rstrip("/") + "/")


def _outermost(paths) -> tuple[str, ...]:
    out: list[str] = []
    for p in sorted(dict.fromkeys(paths), key=lambda p: (len(p), p)):
        if not any(within(p, o) for o in out):
            out.append(p)
    return tuple(out)


def work_set(cwd: str, homes: tuple[str, ...], allow_write: tuple[str, ...] = (), *,
             with_files: bool = False, tmp: str = "/tmp") -> WorkSet:
    """The work set of a run started in `cwd` (realpath) by a user whose
    home(s) are `homes` (realpaths). Without [files]: cwd, /tmp; with
    [files] (its outside = "held"): allow_write alone, as the table says."""
    left_out: list[str] = []
    paths: list[str] = list(allow_write)
    if not with_files:
        if any(within(cwd, p) for p in (*paths, tmp)):
            pass        # in the work set all the same (a home under /tmp)
        elif cwd == "/" or any(within(h, cwd) for h in homes):
            what = "/" if cwd == "/" else "your home directory" if cwd in homes else \
                "an ancestor of your home directory"
            left_out.append(f"{cwd} is {what}, so it is not in the run's work set: the program's "
                            f"writes there are held, not made (name what it may write with "
                            f"[files] allow_write, or start in a project directory)")
        else:
            paths.append(cwd)
        paths.append(tmp)
    return WorkSet(_outermost(paths), tuple(left_out))


class Mount(NamedTuple):
    point: str
    fstype: str
    read_only: bool


def mount_table(mountinfo: str) -> list[Mount]:
    """/proc/self/mountinfo -> the visible mounts, one per point (the last
    mounted at a point covers the ones before), in the file's order."""
    by_point: dict[str, Mount] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 10 or "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        point = unescape(fields[4])
        by_point.pop(point, None)
        by_point[point] = Mount(point, fields[dash + 1], "ro" in fields[5].split(","))
    return list(by_point.values())


class LayerPlan(NamedTuple):
    """What init mounts (stages/helper/held_layer.py)."""
    targets: tuple[str, ...]       # directories that each get an overlay
    read_only: tuple[str, ...]     # writable mounts made read-only (split, or kernel file systems)


def layer_plan(mounts: list[Mount], work: tuple[str, ...], entries_of, *,
               anchors: tuple[str, ...] = (), fits=None, looked_into: int = 2) -> LayerPlan:
    """entries_of(dir) -> [(name, is_dir)] (symlinks are not directories;
    [] when it cannot be read); is a directory at all: `entries_of` lists it.
    fits(dir) -> whether an overlay may be rooted there: the directory is the
    invoker's own or writable by them. Overlay copies a file's directories
    up before it writes the file, each with its owner; in a user namespace
    a directory owned by an id the namespace does not map cannot be copied
    (EOVERFLOW). So the overlay over a home must be rooted at the home
    itself (anchors: the invoker's homes), never at /home, and a directory
    that does not fit but holds one that does (/var, holding /var/tmp) is
    split too, looked into `looked_into` levels below its mount at most. A
    directory that does not fit and holds none that does (/usr for an
    unprivileged user) gets no overlay: it stays on its mount, read-only
    (the invoker could make nothing there; a file of theirs deep inside one
    is read-only, never written)."""
    fits = fits or (lambda _d: True)
    points = [m.point for m in mounts]
    targets: list[str] = []
    read_only: list[str] = []
    for m in mounts:
        if m.read_only or any(within(m.point, k) for k in KEPT_TOPS) \
                or any(within(m.point, w) for w in work):
            continue
        if m.fstype in KERNEL_FS:
            read_only.append(m.point)
            continue
        if m.point not in _dir_points(m, points, entries_of):
            read_only.append(m.point)      # a file bound on its own: overlay takes directories only
            continue
        below = [p for p in points if p != m.point and within(p, m.point)]
        # Only the mounts right below this one split it: one further down
        # lies on a mount of its own (which is judged by itself).
        direct = [p for p in below
                  if not any(q != p and within(p, q) for q in below)]
        must_split: set[str] = set()
        for p in [*direct, *(a for a in anchors if a != m.point and within(a, m.point)
                             and not any(within(a, w) for w in work))]:
            d = os.path.dirname(p)
            while within(d, m.point) and d not in must_split:
                must_split.add(d)
                d = os.path.dirname(d)
        split = _Split(m.point, points, work, entries_of, must_split, fits, looked_into)
        split.visit(m.point, 0)
        targets += split.targets
        if split.split:
            read_only.append(m.point)
    return LayerPlan(tuple(targets), tuple(read_only))


def _dir_points(m: Mount, points, entries_of) -> set:
    """{m.point} when the mount's point is a directory (its parent lists it as one)."""
    if m.point == "/":
        return {"/"}
    name = os.path.basename(m.point)
    return {m.point} if any(n == name and d for n, d in entries_of(os.path.dirname(m.point))) else set()


class _Split:
    """One mount's directories walked down from its root: each becomes a
    target, or is split (stays the real mount, read-only) into its
    subdirectories."""

    def __init__(self, root, points, work, entries_of, must_split, fits, looked_into):
        self.root, self.points, self.work = root, points, work
        self.entries_of, self.must_split, self.fits = entries_of, must_split, fits
        self.looked_into = looked_into
        self.targets: list[str] = []
        self.split = False

    def _subdirs(self, d: str) -> list[str]:
        return [os.path.join(d, n) for n, is_dir in self.entries_of(d) if is_dir]

    def visit(self, d: str, depth: int) -> None:
        if any(within(d, w) for w in self.work):
            return                       # bound back real
        if d != self.root and d in self.points:
            return                       # another mount: judged by itself
        if d in self.must_split:
            pass
        elif self.fits(d):
            self.targets.append(d)
            return
        elif depth >= self.looked_into or not any(self.fits(c) for c in self._subdirs(d)):
            self.split = True            # stays on its mount, made read-only
            return
        self.split = True
        for child in self._subdirs(d):
            self.visit(child, depth + 1)


# --- after the run: what a held path would run on its own later ---------------

RUNS_LATER = ("shell start-up", "PATH", "python start-up", "git", "agent settings", "vpnw",
              "tool start-up")

_SHELL = (".profile", ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".bash_aliases",
          ".zshenv", ".zprofile", ".zshrc", ".zlogin", ".zlogout", ".kshrc", ".mkshrc", ".cshrc",
          ".tcshrc", ".login", ".logout", ".inputrc", ".config/fish", ".pam_environment",
          ".config/environment.d", ".xprofile", ".xinitrc", ".xsession", ".xsessionrc",
          ".ssh/rc", ".ssh/environment", ".ssh/authorized_keys", ".ssh/authorized_keys2",
          ".ssh/config", ".oh-my-zsh", ".zshrc.d", ".bashrc.d", ".config/zsh")
_GIT = (".gitconfig", ".config/git", ".git-templates", ".githooks")
_AGENTS = (".claude", ".claude.json", ".codex", ".gemini", ".copilot", ".aider.conf.yml",
           ".config/opencode", ".cursor", ".continue", ".mcp.json", ".config/github-copilot")
_TOOLS = (".lessfilter", ".lesskey", ".config/lesskey", ".curlrc", ".wgetrc", ".npmrc", ".yarnrc",
          ".yarnrc.yml", ".gdbinit", ".config/gdb", ".ipython", ".config/ipython",
          ".config/autostart", ".config/systemd", ".local/share/systemd", ".vimrc", ".vim",
          ".config/nvim", ".emacs", ".emacs.d", ".tmux.conf", ".config/tmux",
          ".config/direnv", ".direnvrc", ".config/pip", ".pip", ".pydistutils.cfg",
          ".local/share/applications", ".config/containers", ".docker", ".cargo/config.toml",
          ".cargo/config", ".config/pypoetry", ".condarc", ".Rprofile", ".psqlrc",
          ".sqliterc", ".config/mimeapps.list", ".mailcap", ".terraformrc", ".config/Code/User")
_PYTHON_NAMES = ("sitecustomize.py", "usercustomize.py")
_GIT_DIR = ("config", "config.worktree", "hooks", "info", "commondir", "modules")


def runs_later(path: str, homes: tuple[str, ...], path_dirs: tuple[str, ...],
               vpnw_paths: tuple[str, ...] = ()) -> str | None:
    """What `path` (absolute) would run later on its own, or None."""
    if any(within(path, v) for v in vpnw_paths) or os.path.basename(path) == "vpnw" \
            and any(os.path.dirname(path) == d for d in path_dirs):
        return "vpnw"
    name = os.path.basename(path)
    if name.endswith(".pth") or name in _PYTHON_NAMES:
        return "python start-up"
    if any(os.path.dirname(path) == d.rstrip("/") or path == d.rstrip("/") for d in path_dirs if d):
        return "PATH"
    if "/.git/" in path and path.split("/.git/", 1)[1].split("/", 1)[0] in _GIT_DIR:
        return "git"
    for home in homes:
        if not within(path, home) or path == home:
            continue
        rel = path[len(home.rstrip("/")) + 1:]
        for names, why in ((_SHELL, "shell start-up"), (_GIT, "git"), (_AGENTS, "agent settings"),
                           (_TOOLS, "tool start-up")):
            if any(rel == n or rel.startswith(n + "/") for n in names):
                return why
    return None


def top_of(path: str, homes: tuple[str, ...]) -> str:
    """The directory a held path is counted under: ~/NAME in a home, else /NAME."""
    for home in homes:
        if within(path, home) and path != home:
            return "~/" + path[len(home.rstrip("/")) + 1:].split("/", 1)[0]
    parts = path.strip("/").split("/", 1)
    return "/" + parts[0]


def shown(path: str, homes: tuple[str, ...]) -> str:
    for home in homes:
        if within(path, home) and path != home:
            return "~/" + path[len(home.rstrip("/")) + 1:]
    return path


def held_line(entries: list[dict], run_id: str, homes: tuple[str, ...], truncated: bool = False,
              most: int = 5) -> str | None:
    """One line: what the run wrote outside its work set, what of it runs
    later on its own first, and the command that shows it. None: nothing."""
    if not entries:
        return None
    later = [e for e in entries if e.get("runs_later")]
    tops: dict[str, int] = {}
    for e in entries:
        top = top_of(e["path"], homes)
        tops[top] = tops.get(top, 0) + 1
    counted = ", ".join(f"{t} {n}" for t, n in sorted(tops.items(), key=lambda t: (-t[1], t[0]))[:most])
    if len(tops) > most:
        counted += f", {len(tops) - most} more"
    n = len(entries)
    parts = [f"held {n}{'+' if truncated else ''} write{'s' if n != 1 else ''} outside the work set"]
    if later:
        names = ", ".join(f"{shown(e['path'], homes)} ({e['runs_later']})" for e in later[:most])
        more = f" and {len(later) - most} more" if len(later) > most else ""
        parts[0] = (f"held {n}{'+' if truncated else ''} write{'s' if n != 1 else ''} outside the "
                    f"work set, of which would run later on its own: {names}{more}")
    return (f"{parts[0]} ({counted}); nothing of it reached your files: "
            f"see `vpnw changes {run_id}`")

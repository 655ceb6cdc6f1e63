"""The held layer, outside the sandbox: made ready before the program
starts, read after it ends (docs/security.md, "The work set and the held
layer"; the on-disk form in docs/architecture.md, "The held layer").

    prepare(...)   ->  HeldLayer: the run's held directory (0700) and what init
                       mounts, or the read-only fallback and why
    collect(...)   ->  held.json (written atomically), the record's
                       `files.held` fields and the one line said at the end

A run that wrote nothing outside its work set leaves nothing behind: its
held directory is removed (a few empty directories per overlay).
"""
from __future__ import annotations

import json
import os
import stat

from stages.config import work_set as ws
from stages.config.protected import HOME_START_UP
from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.wire.helper_plan import Files

MAX_ENTRIES = 10_000
HASHED_UP_TO = 64 * 1024 * 1024
# The record's files.held: what fits in this many characters of entries.
RECORD_BUDGET = 3000
OPAQUE_XATTRS = ("user.overlay.opaque", "trusted.overlay.opaque")
# Overlay in a user namespace: Linux 5.11 (`userxattr`).
MIN_KERNEL = (5, 11)


def held_root(state: str) -> str:
    return os.path.join(state, "held")


class HeldLayer(NamedTuple):
    """How this run's writes outside its work set are kept from the real files."""
    work: ws.WorkSet
    dir: str | None            # held/<run-id>/, when the layer is on
    hide: str                  # held/ (every run's layers), hidden from the program
    read_only_why: str | None  # the layer is off: writes outside fail EROFS, and why
    homes: tuple = ()          # the invoker's homes (realpaths): each an overlay of its own


def kernel_can(release: str | None = None) -> str | None:
    """None when this kernel can mount overlay in a user namespace, else why not."""
    release = release or os.uname().release
    try:
        version = tuple(int(x) for x in release.split("-")[0].split(".")[:2])
    except ValueError:
        return None     # unreadable: try, and fall back per directory
    if version < MIN_KERNEL:
        return (f"this kernel ({release}) cannot mount an overlay in a user namespace "
                f"(Linux {MIN_KERNEL[0]}.{MIN_KERNEL[1]} or later can)")
    return None


def prepare(run_id: str, state: str, cwd: str, homes: tuple[str, ...], files) -> HeldLayer | None:
    """The layer of a run without [files] (or whose [files] has no
    allow_write: no write limit, as without one), or with [files] outside =
    "held"; None when [files] keeps its read-only meaning, or lifts the
    write limit (allow_write = ["/"])."""
    limited = files is not None and files.allow_write is not None
    if limited and (not files.limits_writes or files.outside != "held"):
        return None
    real_cwd = os.path.realpath(cwd)
    real_homes = tuple(os.path.realpath(h) for h in homes)
    allow = tuple(l.path for l in files.writable()) if limited else ()
    work = ws.work_set(real_cwd, real_homes, allow, with_files=limited,
                       tmp=os.path.realpath("/tmp"))
    root = held_root(state)
    why = kernel_can()
    if why:
        return HeldLayer(work, None, root, why, real_homes)
    held = os.path.join(root, run_id)
    for attempt in range(3):
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
            os.mkdir(held, 0o700)
            break
        except FileNotFoundError:
            continue        # another run removed held/ as it ended with nothing held
        except OSError as e:
            return HeldLayer(work, None, root, f"vpnw cannot make the run's held directory {held} "
                                           f"({e.strerror})", real_homes)
    else:
        return HeldLayer(work, None, root, f"vpnw cannot make the run's held directory {held}",
                     real_homes)
    return HeldLayer(work, held, root, None, real_homes)


def read_only_plan(layer: HeldLayer, files_plan=None):
    """The fallback: writes outside the work set fail read-only (EROFS);
    a [files] table's deny_read still hidden."""
    return Files(hide=tuple(files_plan.hide) if files_plan is not None else (), limit_writes=True,
                 writable=tuple((p, "dir" if os.path.isdir(p) else "file") for p in layer.work.paths),
                 landlock_abi=0)


# --- after the run --------------------------------------------------------------

def _sha256(path: str, size: int) -> str | None:
    if size > HASHED_UP_TO:
        return None
    import hashlib  # after the run only: hashlib's _hashlib (OpenSSL, ~3 ms) stays off every run's start
    h = hashlib.sha256()
    try:
        # Never follows a link, never blocks on a FIFO put there meanwhile.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return h.hexdigest()


def _before(real: str) -> dict:
    try:
        st_ = os.lstat(real)
    except OSError:
        return {"exists": False, "size": None, "mtime_ns": None, "sha256": None}
    regular = stat.S_ISREG(st_.st_mode)
    return {"exists": True, "size": st_.st_size if regular else None, "mtime_ns": st_.st_mtime_ns,
            "sha256": _sha256(real, st_.st_size) if regular else None}


def _opaque(path: str) -> bool:
    for name in OPAQUE_XATTRS:
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


def walk_upper(upper: str, mount: str):
    """(kind, real path, upper path, lstat) of each held change in one upper
    directory: files, links, whiteouts (deleted), opaque directories (what
    was there before is gone), and directories new to the real tree. A
    directory that exists below (copied up only for an entry in it) is not a
    change of its own."""
    stack = [(upper, mount)]
    while stack:
        here, real_here = stack.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            real = os.path.join(real_here, e.name)
            try:
                st_ = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISCHR(st_.st_mode) and st_.st_rdev == 0:
                yield "deleted", real, e.path, st_
            elif stat.S_ISDIR(st_.st_mode):
                if _opaque(e.path):
                    yield "opaque-dir", real, e.path, st_
                elif not os.path.isdir(real) or os.path.islink(real):
                    yield "dir", real, e.path, st_
                stack.append((e.path, real))
            elif stat.S_ISLNK(st_.st_mode):
                yield "symlink", real, e.path, st_
            else:
                yield "file", real, e.path, st_


def _read_layers(held: str) -> list[dict]:
    try:
        with open(os.path.join(held, "layers.json"), encoding="utf-8", errors="surrogateescape") as f:
            layers = json.load(f)
    except (OSError, ValueError):
        return []
    return [l for l in layers if isinstance(l, dict) and isinstance(l.get("mount"), str)
            and isinstance(l.get("upper"), str) and not l["upper"].startswith("/") and ".." not in l["upper"]]


def not_held(layer: HeldLayer) -> list[tuple[str, str]]:
    """(directory, errno name) of each directory init bound read-only
    because its overlay could not be mounted."""
    if layer.dir is None:
        return []
    try:
        with open(os.path.join(layer.dir, "not-held"), encoding="utf-8", errors="replace") as f:
            return [tuple(line.rstrip("\n").split("\t", 1)) for line in f if "\t" in line]
    except OSError:
        return []


class HeldList(NamedTuple):
    entries: list
    truncated: bool
    empty: bool = False      # nothing held: the held directory is to be removed (remove_empty)


def collect(layer: HeldLayer, run_id: str, homes: tuple[str, ...], path_dirs: tuple[str, ...],
            vpnw_paths: tuple[str, ...]) -> HeldList:
    """Walk the uppers, write held.json; a run that held nothing leaves no directory."""
    if layer.dir is None:
        return HeldList([], False)
    entries: list[dict] = []
    truncated = False
    for each in _read_layers(layer.dir):
        upper = os.path.join(layer.dir, each["upper"])
        for kind, real, path, st_ in walk_upper(upper, each["mount"]):
            if len(entries) >= MAX_ENTRIES:
                truncated = True
                break
            # Only a regular file is read: a FIFO the program left would block the open.
            regular = kind == "file" and stat.S_ISREG(st_.st_mode)
            entries.append({
                "path": real, "kind": kind, "size": st_.st_size if regular else 0,
                "sha256": _sha256(path, st_.st_size) if regular else None,
                "mode": stat.S_IMODE(st_.st_mode),
                "runs_later": ws.runs_later(real, homes, path_dirs, vpnw_paths),
                "before": _before(real)})
        if truncated:
            break
    if not entries and not not_held(layer):
        return HeldList([], False, empty=True)
    entries.sort(key=lambda e: e["path"])
    _write_held_json(layer.dir, {"v": 1, "run": run_id, "entries": entries, "truncated": truncated})
    return HeldList(entries, truncated)


def remove_empty(layer: HeldLayer) -> None:
    """The held directory of a run that held nothing, and held/ when no run
    holds anything: done while the recorder signs the record."""
    remove(layer.dir)
    try:
        os.rmdir(os.path.dirname(layer.dir))
    except OSError:
        pass


def _write_held_json(held: str, doc: dict) -> None:
    # After the run, when record.events has long imported orjson with its
    # stand-ins (stages/startup/imports.py); at this module's top it would be
    # the first import, bringing dataclasses, inspect and the rest to the start.
    import orjson
    tmp = os.path.join(held, ".held.json.tmp")
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(held, "held.json"))


def remove(held: str) -> None:
    """A held directory, gone. Overlay leaves `work/work` and, with
    `volatile`, `work/work/incompat/volatile` with mode 0 (root passes
    them by; the user makes them 0700 first). The layout init made is
    removed directly (a run that held nothing: a few calls per overlay);
    anything else by a walk that unlocks each directory before it lists it."""
    locked = ("work/work", "work/work/incompat/volatile") if os.geteuid() != 0 else ()
    try:
        with os.scandir(os.path.join(held, "layers")) as it:
            numbered = [e.path for e in it if e.name.isdigit()]
        for layer in numbered:
            for part in locked:
                os.chmod(os.path.join(layer, part), 0o700)
            os.unlink(os.path.join(layer, "work/work/incompat/volatile/dirty"))
            for part in ("work/work/incompat/volatile", "work/work/incompat", "work/work", "work",
                         "upper", ""):
                os.rmdir(os.path.join(layer, part) if part else layer)
        os.rmdir(os.path.join(held, "layers"))
        for name in ("layers.json", "not-held"):
            try:
                os.unlink(os.path.join(held, name))
            except FileNotFoundError:
                pass
        os.rmdir(held)
        return
    except OSError:
        pass
    # Only when the quick removal above failed: record.held brings dataclasses
    # and hashlib (OpenSSL) onto the start of every run that imports this module.
    from stages.record.held import remove_tree
    remove_tree(held)


def record_fields(held: HeldList, budget: int = RECORD_BUDGET) -> dict:
    """files.held: the entries that fit (what runs later first), the rest counted."""
    ordered = sorted(held.entries, key=lambda e: (e["runs_later"] is None, e["path"]))
    listed = []
    for e in ordered:
        item = {k: e[k] for k in ("path", "kind", "size", "sha256", "runs_later")}
        budget -= len(e["path"]) + 140
        if budget < 0 or len(listed) >= 60:
            break
        listed.append(item)
    out = {"count": len(held.entries), "entries": listed, "truncated": held.truncated}
    if len(listed) < len(held.entries):
        out["unlisted"] = len(held.entries) - len(listed)
    return out


def outside_work_set(protection, layer: HeldLayer):
    """With the layer, a home's start-up files outside the work set are held
    like every other write there (listed after the run, never applied),
    not read-only; vpnw's installation and evidence, what the config names
    and everything inside the work set stay as stages/config/protected.py
    says."""
    if layer.dir is None:
        return protection
    held_kinds = set(HOME_START_UP)

    def kept(entry) -> bool:
        return entry.why not in held_kinds or any(ws.within(entry.path, w) for w in layer.work.paths)

    return protection._replace(read_only=tuple(e for e in protection.read_only if kept(e)),
                               absent=tuple(e for e in protection.absent if kept(e)))


def start_record(layer: HeldLayer) -> dict:
    """run.start's work_set."""
    return {"work_set": {"paths": list(layer.work.paths),
                         "outside": "held" if layer.dir else "read-only",
                         **({"why": layer.read_only_why} if layer.read_only_why else {}),
                         **({"left_out": list(layer.work.left_out)} if layer.work.left_out else {})}}

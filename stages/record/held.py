"""A run's held writes, read back for the person: what the program wrote
outside its work set, kept in the run's held layer instead of the real files
(docs/security.md, "The work set and the held layer").

The layer's files are the program's: their names and contents may carry
anything, so nothing here follows a link inside the layer, and every name
that reaches a terminal goes through `text.printable`. `held.json` is vpnw's
own, written outside the sandbox after the run (docs/architecture.md, "The
held layer on disk"); `before` in each entry is the real file as it was when
the run ended, so a file the person changed since is never overwritten.

The core is pure where it can be: `plan_apply` says what applying would do
and why it may not; `apply_entry` does one entry with the checks repeated
right before the write.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import time
from dataclasses import dataclass, field

import orjson

from stages.record.run_file import vpnw_state_dir

MANIFEST = "held.json"
LAYERS = "layers.json"
# Kept until one of these runs out (oldest first): a held layer is the
# person's to review, not a second home (docs/security.md).
KEEP_SECONDS = 30 * 24 * 3600
KEEP_BYTES = 2 * 1024 ** 3
DIFF_LIMIT = 1 << 20          # a larger file is "binary or large": no diff
_CHUNK = 1 << 20


class HeldProblem(Exception):
    """A held layer that cannot be read or applied; the message says why."""


@dataclass(frozen=True)
class Before:
    exists: bool
    size: int | None = None
    mtime_ns: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class HeldEntry:
    path: str
    kind: str                      # file | dir | symlink | deleted | opaque-dir
    size: int | None
    sha256: str | None
    mode: int | None
    runs_later: str | None
    before: Before


@dataclass
class HeldRun:
    run: str
    directory: str                 # held/<run-id>
    entries: list[HeldEntry]
    truncated: bool
    layers: list[tuple[str, str]] = field(default_factory=list)   # (mount, upper dir)

    @property
    def runs_later(self) -> list[HeldEntry]:
        return [e for e in self.entries if e.runs_later]


KINDS = ("file", "dir", "symlink", "deleted", "opaque-dir")


def held_root() -> str:
    return os.path.join(vpnw_state_dir(), "held")


def held_dir(run_id: str, root: str | None = None) -> str:
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise HeldProblem(f"not a run id: {run_id!r}")
    return os.path.join(root or held_root(), run_id)


def _entry(raw: dict) -> HeldEntry:
    before = raw.get("before") or {}
    if not isinstance(raw.get("path"), str) or not os.path.isabs(raw["path"]):
        raise HeldProblem(f"an entry without an absolute path: {raw.get('path')!r}")
    if raw.get("kind") not in KINDS:
        raise HeldProblem(f"an entry of unknown kind {raw.get('kind')!r}")
    return HeldEntry(path=os.path.normpath(raw["path"]), kind=raw["kind"], size=raw.get("size"),
                     sha256=raw.get("sha256"), mode=raw.get("mode"),
                     runs_later=raw.get("runs_later"),
                     before=Before(exists=bool(before.get("exists")), size=before.get("size"),
                                   mtime_ns=before.get("mtime_ns"), sha256=before.get("sha256")))


def load(run_id: str, root: str | None = None) -> HeldRun | None:
    """The held layer of `run_id`, or None when the run holds nothing."""
    directory = held_dir(run_id, root)
    try:
        with open(os.path.join(directory, MANIFEST), "rb") as stream:
            raw = orjson.loads(stream.read())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise HeldProblem(f"cannot read {os.path.join(directory, MANIFEST)}: {exc}") from None
    if not isinstance(raw, dict) or raw.get("v") != 1 or not isinstance(raw.get("entries"), list):
        raise HeldProblem(f"{os.path.join(directory, MANIFEST)} is not a held-writes manifest (v1)")
    layers = []
    try:
        with open(os.path.join(directory, LAYERS), "rb") as stream:
            for layer in orjson.loads(stream.read()):
                upper = os.path.normpath(os.path.join(directory, layer["upper"]))
                if not upper.startswith(directory + os.sep):
                    raise HeldProblem(f"a layer outside its run's directory: {layer['upper']!r}")
                layers.append((os.path.normpath(layer["mount"]), upper))
    except FileNotFoundError:
        pass
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise HeldProblem(f"cannot read {os.path.join(directory, LAYERS)}: {exc}") from None
    return HeldRun(run=raw.get("run") or run_id, directory=directory,
                   entries=[_entry(e) for e in raw["entries"] if isinstance(e, dict)],
                   truncated=bool(raw.get("truncated")), layers=layers)


def count(run_id: str, root: str | None = None) -> int | None:
    """How many writes `run_id` holds; None when it holds none (cheap: no hashing)."""
    try:
        held = load(run_id, root)
    except HeldProblem:
        return None
    return len(held.entries) if held else None


# ── where a held path's bytes are ────────────────────────────────────────────

def upper_of(held: HeldRun, path: str) -> str:
    """The file in the layer that holds `path` (the longest mount that contains it)."""
    best = None
    for mount, upper in held.layers:
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            if best is None or len(mount) > len(best[0]):
                best = (mount, upper)
    if best is None:
        raise HeldProblem(f"no layer of run {held.run} holds {path}")
    mount, upper = best
    rest = os.path.relpath(path, mount)
    return upper if rest == "." else os.path.join(upper, rest)


def _open_in_layer(held: HeldRun, path: str) -> int:
    """An fd of the held file, opened without following any link in the layer:
    each component is opened O_NOFOLLOW from the layer's root down."""
    upper = upper_of(held, path)
    mount_upper = next(u for m, u in held.layers if upper == u or upper.startswith(u + os.sep))
    fd = os.open(mount_upper, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parts = [p for p in os.path.relpath(upper, mount_upper).split(os.sep) if p not in ("", ".")]
        for i, part in enumerate(parts):
            flags = os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_RDONLY if i == len(parts) - 1 else
                                                     os.O_RDONLY | os.O_DIRECTORY)
            nxt = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_held(held: HeldRun, path: str, limit: int | None = None) -> bytes:
    fd = _open_in_layer(held, path)
    with os.fdopen(fd, "rb") as stream:
        return stream.read(-1 if limit is None else limit)


# ── the real side ────────────────────────────────────────────────────────────

def sha256_of(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def real_now(path: str) -> Before:
    """The real file as it is now, in `before`'s terms."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Before(exists=False)
    digest = sha256_of(path) if stat.S_ISREG(st.st_mode) else None
    return Before(exists=True, size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=digest)


def changed_since(entry: HeldEntry, now: Before) -> str | None:
    """Why the real file no longer is what it was when the run ended, or None."""
    was = entry.before
    if was.exists != now.exists:
        return "created since the run" if now.exists else "removed since the run"
    if not was.exists:
        return None
    if entry.kind in ("dir", "opaque-dir") and was.sha256 is None and now.sha256 is None:
        return None
    if was.sha256 is not None and now.sha256 != was.sha256:
        return "changed since the run"
    if was.sha256 is None and (was.size, was.mtime_ns) != (now.size, now.mtime_ns):
        return "changed since the run"
    return None


# ── choosing what to apply ───────────────────────────────────────────────────

def select(held: HeldRun, names: list[str]) -> tuple[list[HeldEntry], list[str]]:
    """The entries the person named (a path, or a directory: everything held
    under it), in an order that makes parents before children; and the names
    that matched nothing."""
    chosen: dict[str, HeldEntry] = {}
    unmatched = []
    for name in names:
        path = os.path.normpath(os.path.abspath(os.path.expanduser(name)))
        hits = [e for e in held.entries
                if e.path == path or e.path.startswith(path.rstrip("/") + "/")]
        if not hits:
            unmatched.append(name)
        for e in hits:
            chosen[e.path] = e
    return sorted(chosen.values(), key=lambda e: (e.path.count("/"), e.path)), unmatched


@dataclass(frozen=True)
class Applied:
    entry: HeldEntry
    done: bool
    why: str          # what was done, or why not


def apply_entry(held: HeldRun, entry: HeldEntry) -> Applied:
    """Make the real path what the run left in its layer, unless the real
    one changed since the run ended. Modes keep only the permission bits
    (never setuid, setgid or sticky: the program chose them)."""
    problem = changed_since(entry, real_now(entry.path))
    if problem:
        return Applied(entry, False, f"not applied: {problem}")
    parent = os.path.dirname(entry.path)
    if entry.kind != "deleted" and not os.path.isdir(parent):
        if os.path.lexists(parent):
            return Applied(entry, False, f"not applied: {parent} is not a directory")
        # Named on its own, a file whose directories the run made too: the
        # person asked for the file, so its directories come with it.
        try:
            os.makedirs(parent, 0o755)
        except OSError as exc:
            return Applied(entry, False, f"not applied: {parent}: {exc.strerror or exc}")
    mode = (entry.mode or 0o644) & 0o777
    try:
        if entry.kind == "deleted":
            if os.path.isdir(entry.path) and not os.path.islink(entry.path):
                shutil.rmtree(entry.path)
            elif os.path.lexists(entry.path):
                os.unlink(entry.path)
            return Applied(entry, True, "removed")
        if entry.kind in ("dir", "opaque-dir"):
            if not os.path.isdir(entry.path):
                os.mkdir(entry.path, mode & 0o777 or 0o755)
            return Applied(entry, True, "directory made" if not entry.before.exists else "kept")
        if entry.kind == "symlink":
            target = os.readlink(upper_of(held, entry.path))
            temp = _temp_name(entry.path)
            os.symlink(target, temp)
            os.replace(temp, entry.path)
            return Applied(entry, True, f"link to {target}")
        data_fd = _open_in_layer(held, entry.path)
        with os.fdopen(data_fd, "rb") as source:
            if entry.sha256 and _digest_stream(source) != entry.sha256:
                return Applied(entry, False, "not applied: the held file is not what the run left")
            source.seek(0)
            temp = _temp_name(entry.path)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         mode)
            try:
                with os.fdopen(fd, "wb") as target:
                    shutil.copyfileobj(source, target, _CHUNK)
                    target.flush()
                    os.fsync(target.fileno())
                os.chmod(temp, mode)
                # The check again, right before the rename: the person's own
                # editor may have saved the file while we copied.
                problem = changed_since(entry, real_now(entry.path))
                if problem:
                    os.unlink(temp)
                    return Applied(entry, False, f"not applied: {problem}")
                os.replace(temp, entry.path)
            except BaseException:
                if os.path.lexists(temp):
                    os.unlink(temp)
                raise
        return Applied(entry, True, "written")
    except OSError as exc:
        return Applied(entry, False, f"not applied: {exc.strerror or exc}")


def _digest_stream(stream) -> str:
    digest = hashlib.sha256()
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _temp_name(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.vpnw-apply-{os.getpid()}-{time.monotonic_ns()}")


def drop(held: HeldRun, paths: list[str] | None = None) -> int:
    """Forget held writes: the named paths (from the manifest), or the whole
    layer. Returns how many entries were dropped."""
    if paths is None:
        n = len(held.entries)
        remove_tree(held.directory)
        return n
    keep = [e for e in held.entries if e.path not in set(paths)]
    dropped = len(held.entries) - len(keep)
    write_manifest(held.directory, held.run, keep, held.truncated)
    held.entries = keep
    return dropped


def forget(held: HeldRun, applied: list[HeldEntry]) -> None:
    """Applied entries leave the manifest; a layer with nothing left goes."""
    done = {e.path for e in applied}
    rest = [e for e in held.entries if e.path not in done]
    if not rest and not held.truncated:
        remove_tree(held.directory)
    else:
        write_manifest(held.directory, held.run, rest, held.truncated)
    held.entries = rest


def write_manifest(directory: str, run_id: str, entries: list[HeldEntry], truncated: bool) -> None:
    doc = {"v": 1, "run": run_id, "truncated": truncated,
           "entries": [{"path": e.path, "kind": e.kind, "size": e.size, "sha256": e.sha256,
                        "mode": e.mode, "runs_later": e.runs_later,
                        "before": {"exists": e.before.exists, "size": e.before.size,
                                   "mtime_ns": e.before.mtime_ns, "sha256": e.before.sha256}}
                       for e in entries]}
    temp = os.path.join(directory, f".{MANIFEST}.{os.getpid()}")
    with open(temp, "wb") as stream:
        stream.write(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temp, os.path.join(directory, MANIFEST))


# ── text diffs ───────────────────────────────────────────────────────────────

def diff(held: HeldRun, entry: HeldEntry) -> list[str]:
    """A unified diff, real file → held file, for text files; otherwise one
    line that says why there is none. The lines are the program's: the
    caller makes them printable."""
    import difflib    # only `vpnw changes` shows a diff: not for the runs that hold writes
    if entry.kind != "file":
        return [f"({entry.kind})"]
    if (entry.size or 0) > DIFF_LIMIT or (entry.before.size or 0) > DIFF_LIMIT:
        return [f"(large: {entry.size} bytes held; no diff)"]
    try:
        new = read_held(held, entry.path, DIFF_LIMIT + 1)
    except OSError as exc:
        return [f"(cannot read the held file: {exc.strerror or exc})"]
    old = b""
    if entry.before.exists:
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as stream:
                old = stream.read(DIFF_LIMIT + 1)
        except OSError as exc:
            return [f"(cannot read the real file: {exc.strerror or exc})"]
    try:
        old_text, new_text = old.decode(), new.decode()
    except UnicodeDecodeError:
        return [f"(binary: {len(old)} → {len(new)} bytes)"]
    if b"\0" in old or b"\0" in new:
        return [f"(binary: {len(old)} → {len(new)} bytes)"]
    return list(difflib.unified_diff(old_text.splitlines(), new_text.splitlines(),
                                     fromfile=entry.path if entry.before.exists else "/dev/null",
                                     tofile=f"{entry.path} (held)", lineterm=""))


# ── keeping held layers bounded ──────────────────────────────────────────────

def _size_of(directory: str) -> int:
    total = 0
    for top, dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
            except OSError:
                pass
    return total


def prune(root: str | None = None, now: float | None = None, keep_seconds: int = KEEP_SECONDS,
          keep_bytes: int = KEEP_BYTES, spare: set[str] | frozenset = frozenset()) -> list[str]:
    """Remove held layers older than `keep_seconds`, then the oldest until the
    rest fit in `keep_bytes`; never one named in `spare` (a run going on).
    Returns the run ids removed."""
    root = root or held_root()
    now = time.time() if now is None else now
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    layers = []
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and name not in spare:
            # A layer without held.json belongs to a run going on (or to one
            # that died): only its age may remove it, never the size budget.
            ended = os.path.exists(os.path.join(path, MANIFEST))
            layers.append((st.st_mtime, name, path, ended))
    layers.sort()
    removed = []
    sizes = {name: _size_of(path) for _, name, path, _ in layers}
    total = sum(sizes.values())
    for mtime, name, path, ended in layers:
        if now - mtime > keep_seconds or (ended and total > keep_bytes):
            remove_tree(path)
            total -= sizes[name]
            removed.append(name)
    return removed


def remove_tree(path: str) -> None:
    """A held directory, gone. Overlay leaves its work directory with mode 0,
    and the program chose the modes of what it wrote: each directory is
    given back to its owner (u+rwx) before it is emptied. Links are never
    followed."""
    def unlock(top: str) -> None:
        try:
            os.chmod(top, 0o700)
            with os.scandir(top) as it:
                subdirs = [e.path for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for sub in subdirs:
            unlock(sub)
    if os.path.isdir(path) and not os.path.islink(path):
        unlock(path)
    shutil.rmtree(path, ignore_errors=True)

"""Run by tests/test_e2e_evidence.py. Tries every way to change a protected
file or directory and prints one JSON line: {"<op> <target>": "ok" | errno
name}. argv[1]: JSON {"files": {name: path}, "dirs": {name: path},
"scratch": a writable directory}. With --control it first makes fresh copies
of the targets under scratch (a file with content, a directory with
runs/old.jsonl) before each attempt, so the same attempts can be shown to
work on unprotected files of the same user."""
import ctypes
import errno
import json
import os
import shutil
import sys
spec, control = json.loads(sys.argv[1]), "--control" in sys.argv
scratch = spec["scratch"]
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REMOUNT, MS_RDONLY, MNT_DETACH = 4096, 32, 1, 2
CLONE_NEWNS, CLONE_NEWUSER = 0x20000, 0x10000000
results = {}

def fresh(kind, name, path):
    if not control:
        return path
    copy = os.path.join(scratch, "control-" + name)
    if os.path.isdir(copy) and not os.path.islink(copy):
        shutil.rmtree(copy)
    elif os.path.lexists(copy):
        os.unlink(copy)
    if kind == "file":
        with open(copy, "w") as out:
            out.write("original\n")
    else:
        os.makedirs(os.path.join(copy, "runs"))
        with open(os.path.join(copy, "runs", "old.jsonl"), "w") as out:
            out.write("original\n")
    return copy

def attempt(label, fn):
    try:
        fn()
        results[label] = "ok"
    except OSError as e:
        results[label] = errno.errorcode.get(e.errno, str(e.errno))

def libc_call(name, *args):
    if getattr(libc, name)(*args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))

def write_to(path, flags):
    fd = os.open(path, flags | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"forged\n")
    finally:
        os.close(fd)

def via_symlink(path, then):
    link = os.path.join(scratch, "link-%d" % len(results))
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(path, link)
    then(link)

def relative(path, then):
    here = os.getcwd()
    os.chdir(os.path.dirname(path))
    try:
        then(os.path.basename(path))
    finally:
        os.chdir(here)

def replacement():
    spare = os.path.join(scratch, "spare-%d" % len(results))
    with open(spare, "w") as out:
        out.write("forged\n")
    return spare

file_attacks = {
    "append": lambda p: write_to(p, os.O_APPEND),
    "overwrite": lambda p: write_to(p, 0),
    "truncate-open": lambda p: write_to(p, os.O_TRUNC),
    "truncate": lambda p: os.truncate(p, 0),
    "chmod": lambda p: os.chmod(p, 0o666),
    "rename-away": lambda p: os.rename(p, p + ".moved"),
    "rename-over": lambda p: os.rename(replacement(), p),
    "delete": lambda p: os.unlink(p),
    "hard-link-then-write": lambda p: (os.link(p, os.path.join(scratch, "hl-%d" % len(results))),
                                       write_to(os.path.join(scratch, "hl-%d" % len(results)), os.O_APPEND)),
    "via-proc-self-root": lambda p: write_to("/proc/self/root" + os.path.abspath(p), os.O_APPEND),
    "via-own-symlink": lambda p: via_symlink(p, lambda link: write_to(link, os.O_APPEND)),
    "via-relative-path": lambda p: relative(p, lambda r: write_to(r, os.O_APPEND)),
}
dir_attacks = {
    "add-run": lambda d: write_to(os.path.join(d, "runs", "r-forged.jsonl"), os.O_CREAT | os.O_EXCL),
    "edit-run": lambda d: write_to(os.path.join(d, "runs", sorted(os.listdir(os.path.join(d, "runs")))[0]),
                                   os.O_TRUNC),
    "delete-run": lambda d: os.unlink(os.path.join(d, "runs", sorted(os.listdir(os.path.join(d, "runs")))[0])),
    "rename-run": lambda d: os.rename(os.path.join(d, "runs", sorted(os.listdir(os.path.join(d, "runs")))[0]),
                                      os.path.join(d, "runs", "r-renamed.jsonl")),
    "mkdir": lambda d: os.mkdir(os.path.join(d, "new")),
    "symlink-inside": lambda d: os.symlink("/etc/passwd", os.path.join(d, "runs", "r-link.jsonl")),
    "rename-dir": lambda d: os.rename(d, d + ".moved"),
    "rename-runs": lambda d: os.rename(os.path.join(d, "runs"), os.path.join(d, "runs.moved")),
    "via-proc-self-root": lambda d: write_to("/proc/self/root" + os.path.abspath(d) + "/runs/r-p.jsonl",
                                             os.O_CREAT),
    "via-own-symlink": lambda d: via_symlink(d, lambda link: write_to(link + "/runs/r-s.jsonl", os.O_CREAT)),
    "via-relative-path": lambda d: relative(os.path.join(d, "runs", "x"),
                                            lambda r: write_to("r-rel.jsonl", os.O_CREAT)),
}
for name, path in spec["files"].items():
    for op, fn in file_attacks.items():
        attempt(f"{op} {name}", lambda: fn(fresh("file", name, path)))
for name, path in spec["dirs"].items():
    for op, fn in dir_attacks.items():
        attempt(f"{op} {name}", lambda: fn(fresh("dir", name, path)))

# Undo the read-only mounts: needs CAP_SYS_ADMIN over the mount namespace.
# Inside, the program has none (root included) and may not make a user
# namespace to get one. The control gets one the ordinary way (root: it has
# it; a user: a new user namespace) and shows the same calls then work.
target = spec["dirs"]["state"]
if control:
    if os.geteuid() != 0:
        uid, gid = os.getuid(), os.getgid()
        libc_call("unshare", CLONE_NEWUSER | CLONE_NEWNS)
        for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(line)
    else:
        libc_call("unshare", CLONE_NEWNS)
    libc_call("mount", None, b"/", None, 1 << 14 | 1 << 18, None)   # MS_REC | MS_PRIVATE
    target = fresh("dir", "mounted", target).encode()
    libc_call("mount", target, target, None, MS_BIND, None)
    libc_call("mount", None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
else:
    target = target.encode()
attempt("remount-rw state", lambda: libc_call("mount", None, target, None, MS_BIND | MS_REMOUNT, None))
attempt("umount state", lambda: libc_call("umount2", target, MNT_DETACH))
attempt("new-user-namespace", lambda: libc_call("unshare", CLONE_NEWUSER | CLONE_NEWNS))
print(json.dumps(results))

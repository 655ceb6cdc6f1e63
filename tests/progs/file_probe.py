"""Attempts on files, each reported as one JSON line: {"op": ..., "result": "ok" | errno name, "data": ...}.

    python file_probe.py '[{"op": "read", "path": "/x"}, ...]'

Run inside vpnw's sandbox and, as a control, outside it: the same attempt with
the same user, so a test can show the attempt itself works where nothing stops it.
"""
import ctypes
import errno
import json
import os
import shutil
import signal
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_OPENAT2 = 437          # x86_64 and aarch64
AT_FDCWD = -100
RESOLVE = {"NO_XDEV": 0x01, "NO_MAGICLINKS": 0x02, "NO_SYMLINKS": 0x04, "BENEATH": 0x08,
           "IN_ROOT": 0x10}
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 0x4000
MNT_DETACH = 2


class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * 128)]


def check(res):
    if res < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return res


def read_fd(fd):
    try:
        return os.read(fd, 200).decode(errors="replace")
    finally:
        os.close(fd)


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)))


def in_child(fn):
    """fn() in a forked child (for steps that change the process); its result or errno."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = {"result": "ok", "data": fn()}
        except OSError as e:
            out = {"result": errno.errorcode.get(e.errno, str(e.errno)), "data": str(e)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    out = json.loads(data)
    if out["result"] != "ok":
        raise OSError(getattr(errno, out["result"], 0), out["data"])
    return out["data"]


def op_read(op):
    with open(op["path"], "rb") as f:
        return f.read(200).decode(errors="replace")


def op_listdir(op):
    return sorted(os.listdir(op["path"]))


def op_write(op):
    with open(op["path"], op.get("mode", "w")) as f:
        f.write(op.get("data", "x"))


def op_open_append(op):
    # Opens for writing and writes nothing: proves write access without changing the file.
    os.close(os.open(op["path"], os.O_WRONLY | os.O_APPEND))


def op_open_read(op):
    # Opens for reading and reads nothing (a device may block): proves read access.
    os.close(os.open(op["path"], os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY))


def op_env(op):
    return os.environ.get(op["var"])


def op_create(op):
    os.close(os.open(op["path"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


def op_chmod(op):
    os.chmod(op["path"], op["mode"])


def op_truncate(op):
    os.truncate(op["path"], 0)


def op_symlink(op):
    os.symlink(op["target"], op["path"])


def op_link(op):
    os.link(op["src"], op["path"])


def op_rename(op):
    os.rename(op["src"], op["path"])


def op_unlink(op):
    os.unlink(op["path"])


def op_rmdir(op):
    os.rmdir(op["path"])


def op_rmtree(op):
    shutil.rmtree(op["path"])


def op_mkdir(op):
    os.mkdir(op["path"])


def op_makedirs(op):
    os.makedirs(op["path"])


def op_move(op):
    # As mv does: a rename, or a copy and a removal where rename says EXDEV.
    shutil.move(op["src"], op["path"])


def op_plant(op):
    # The parents made as needed, then the file written whole.
    os.makedirs(os.path.dirname(op["path"]), exist_ok=True)
    with open(op["path"], "w") as f:
        f.write(op.get("data", "x"))


def op_openat2(op):
    how = OpenHow(os.O_RDONLY, 0, sum(RESOLVE[r] for r in op["resolve"]))
    dirfd = os.open(op["dir"], os.O_PATH) if op.get("dir") else AT_FDCWD
    try:
        fd = check(libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dirfd), op["path"].encode(),
                                ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how))))
    finally:
        if dirfd != AT_FDCWD:
            os.close(dirfd)
    return read_fd(fd)


def op_proc_cwd(op):
    """A child sits in op["dir"]; read op["rel"] through /proc/<child>/cwd."""
    pid = os.fork()
    if pid == 0:
        os.chdir(op["dir"])
        time.sleep(30)
        os._exit(0)
    try:
        for _ in range(500):
            if os.readlink(f"/proc/{pid}/cwd") == op["dir"]:
                break
            time.sleep(0.01)
        with open(f"/proc/{pid}/cwd/{op['rel']}", "rb") as f:
            return f.read(200).decode(errors="replace")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def op_name_to_handle(op):
    handle = FileHandle(128, 0)
    mount_id = ctypes.c_int()
    check(libc.name_to_handle_at(AT_FDCWD, op["path"].encode(), ctypes.byref(handle),
                                 ctypes.byref(mount_id), 0))
    return {"type": handle.handle_type, "bytes": bytes(handle.f_handle[:handle.handle_bytes]).hex()}


def op_open_by_handle(op):
    raw = bytes.fromhex(op["handle"]["bytes"])
    handle = FileHandle(len(raw), op["handle"]["type"])
    ctypes.memmove(handle.f_handle, raw, len(raw))
    mount_fd = os.open(op["mount"], os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = check(libc.open_by_handle_at(mount_fd, ctypes.byref(handle), os.O_RDONLY))
    finally:
        os.close(mount_fd)
    return read_fd(fd)


def op_remount_rw(op):
    mount(None, op["path"], None, MS_REMOUNT | MS_BIND)


def op_umount(op):
    check(libc.umount2(op["path"].encode(), MNT_DETACH))


def op_mount_tmpfs(op):
    mount("tmpfs", op["path"], "tmpfs", 0)


def op_bind(op):
    mount(op["src"], op["path"], None, MS_BIND | MS_REC)


def op_unshare_mount(op):
    """In a child: a new user + mount namespace (capabilities there), then a
    tmpfs on op["path"]: the way root would get mount rights back if it could."""
    def body():
        uid, gid = os.getuid(), os.getgid()
        check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS))
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
        mount("tmpfs", op["path"], "tmpfs", 0)
        return sorted(os.listdir(op["path"]))
    return in_child(body)


def main():
    for op in json.loads(sys.argv[1]):
        fn = globals()["op_" + op["op"]]
        try:
            out = {"result": "ok", "data": fn(op)}
        except OSError as e:
            out = {"result": errno.errorcode.get(e.errno, str(e.errno)), "data": None}
        out["op"] = op.get("name", op["op"])
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

"""The seccomp filter's BPF as libseccomp made it at install, kept beside the code.

The helper needs one of the same three BPF programs every run (filter_bpf
of the rules: plain, supervised, --allow-unix-sockets), and making one
through pyseccomp (its import, then a ctypes call per rule) was the longest
step of the helper's start before its plan (docs/architecture.md, "Start-up
budget"). `scripts/setup` runs `python -m stages.helper.seccomp_cache` once
vpnw is installed: libseccomp makes the three programs and they are written to
FILE, beside this module. A run uses an entry only when its key matches,
else it asks libseccomp as before; a cache that is missing, unreadable,
malformed, or not as protected as the code never stops a run.

The key is everything libseccomp's output depends on, byte for byte: the
rules themselves (filter_rules), the code that hands them to libseccomp
(seccomp_rules.py and pyseccomp's source), libseccomp's version and the API
level it finds in the kernel, and the machine. A new vpnw, pyseccomp,
libseccomp or kernel feature set misses the cache; nothing is ever used for
rules it was not made from.

Who can change the file can change the code: it is written with the code's
owner and mode, and it is used only when it is a regular file owned by the
code's owner (or root) that neither group nor others may write, like
seccomp_rules.py itself (docs/security.md, "The seccomp filter's cache").
The file is marshal data, as the .pyc files beside it are.
"""
from __future__ import annotations

import marshal
import os
import stat
import sys

from stages.helper import seccomp_rules

FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seccomp_filters.marshal")
FORMAT = b"vpnw seccomp cache 1"
MAX_SIZE = 1 << 20          # the three programs and their keys are ~110 KiB; far more is not ours
COMBINATIONS = ((False, False), (False, True), (True, False))   # (allow_unix_sockets, supervised)


def _file_bytes(path: str | None) -> bytes:
    if not path:
        return b"-"
    with open(path, "rb") as stream:
        return stream.read()


def _pyseccomp_source() -> str | None:
    """Where `import pyseccomp` would find its code (the first entry of
    sys.path that has it), found without importing anything."""
    for entry in sys.path:
        for name in ("pyseccomp.py", os.path.join("pyseccomp", "__init__.py")):
            candidate = os.path.join(entry or ".", name)
            if os.path.isfile(candidate):
                return candidate
    return None


def library_facts() -> bytes:
    """libseccomp's version and the API level it sees in this kernel (what
    its BPF may depend on beyond the rules), and the machine."""
    version, api = seccomp_rules.libseccomp_version()
    return f"libseccomp {'.'.join(map(str, version))} api {api} {os.uname().machine}".encode()


def key(allow_unix_sockets: bool, supervised: bool, facts: bytes) -> bytes:
    """Everything the program depends on, itself (no digest of it: the
    lookup compares every byte, and needs no hash module)."""
    parts = (FORMAT, repr((allow_unix_sockets, supervised)).encode(),
             repr(seccomp_rules.filter_rules(allow_unix_sockets, supervised)).encode(),
             _file_bytes(seccomp_rules.__file__), _file_bytes(_pyseccomp_source()), facts)
    return b"".join(len(part).to_bytes(8, "big") + part for part in parts)


def _as_protected_as_the_code(info: os.stat_result) -> bool:
    code = os.stat(seccomp_rules.__file__)
    return (stat.S_ISREG(info.st_mode) and info.st_uid in (0, code.st_uid)
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and info.st_size <= MAX_SIZE)


def _read(path: str) -> dict | None:
    # O_NONBLOCK: a FIFO in its place fails the checks, it does not hold the run.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not _as_protected_as_the_code(info):
            return None
        data = os.read(fd, MAX_SIZE + 1)
    finally:
        os.close(fd)
    table = marshal.loads(data)
    return table if isinstance(table, dict) else None


def cached_bpf(allow_unix_sockets: bool, supervised: bool, path: str | None = None) -> bytes | None:
    """libseccomp's BPF for these rules, made at install; None (ask
    libseccomp) when there is none for this key or the file cannot be trusted."""
    try:
        table = _read(path or FILE)
        if table is None:
            return None
        bpf = table.get(key(allow_unix_sockets, supervised, library_facts()))
    except Exception:       # noqa: BLE001 - whatever is wrong with it, libseccomp answers instead
        return None
    if type(bpf) is not bytes or not bpf or len(bpf) % 8:      # sizeof(struct sock_filter)
        return None
    return bpf


def write(path: str | None = None) -> str:
    """Make every program with libseccomp and write them to `path`, with the
    code's owner and mode (0644): what scripts/setup runs after installing."""
    path = path or FILE
    facts = library_facts()
    table = {key(unix, supervised, facts): seccomp_rules.filter_bpf(unix, supervised=supervised)
             for unix, supervised in COMBINATIONS}
    temp = f"{path}.{os.getpid()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, marshal.dumps(table))
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)
    os.replace(temp, path)
    return path


if __name__ == "__main__":
    try:
        print(f"seccomp_cache: wrote {write()}")
    except (ImportError, OSError, RuntimeError, ValueError) as exc:
        print(f"seccomp_cache: not written ({exc}); each run asks libseccomp", file=sys.stderr)

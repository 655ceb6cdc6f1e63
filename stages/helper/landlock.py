"""Landlock through ctypes: the second layer of allow_write.

Three system calls, the same numbers on x86_64 and aarch64 (they came after
the syscall tables were unified): landlock_create_ruleset 444,
landlock_add_rule 445, landlock_restrict_self 446.

Landlock grants, it never subtracts: a ruleset handles a set of accesses and
then allows them only beneath the paths it names. That fits allow_write
(writes are handled, and allowed beneath the writable paths) but not
deny_read (hiding ~/.ssh would mean allowing reads everywhere else, path by
path), which stays with the mount layer alone.
"""
from __future__ import annotations

import ctypes
import os

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13      # ABI 2
TRUNCATE = 1 << 14   # ABI 3

# Accesses that only make sense on a file: a rule on a regular file may hold no other.
FILE_ACCESSES = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE


def write_accesses(abi: int) -> int:
    """Every access that changes the file system, as far as this ABI knows them."""
    access = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG
              | MAKE_SOCK | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM)
    if abi >= 2:
        access |= REFER
    if abi >= 3:
        access |= TRUNCATE
    return access


class _RulesetAttr(ctypes.Structure):
    # Only handled_access_fs: the kernel accepts the ABI 1 size and treats
    # the later fields (network, scopes) as not handled.
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _call(number: int, *args) -> int:
    res = _libc.syscall(ctypes.c_long(number), *args)
    if res < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return res


def abi_version() -> int:
    """The Landlock ABI this kernel offers; 0 when it has none (ENOSYS) or it
    is turned off (EOPNOTSUPP: not in the lsm= list)."""
    try:
        return _call(SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                     ctypes.c_uint32(CREATE_RULESET_VERSION))
    except OSError:
        return 0


# Device files a program may open for writing. Not all of /dev: a read-only
# mount does not stop writes to a device node, and root inside (uid 0, no
# capabilities) still owns /dev/kmsg, disks and loop devices.
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                    "/dev/tty", "/dev/ptmx")


def rules_for(writable: list[tuple[str, str]], abi: int) -> list[tuple[str, int]]:
    """(path, allowed access) for each rule of the write ruleset. Besides the
    policy's writable paths: the harmless devices and terminals, the
    program's own /proc (its knobs are read-only mounts) and its private
    /dev/shm; never making anything under /dev."""
    full = write_accesses(abi)
    rules = [(path, full & FILE_ACCESSES if kind == "file" else full) for path, kind in writable]
    opened = (WRITE_FILE | TRUNCATE) & full
    rules += [(dev, opened) for dev in WRITABLE_DEVICES if os.path.exists(dev)]
    for tree in ("/dev/pts", "/proc"):
        if os.path.isdir(tree):
            rules.append((tree, opened))
    if os.path.isdir("/dev/shm"):
        rules.append(("/dev/shm", full))
    return rules


def restrict_writes(writable: list[tuple[str, str]], abi: int) -> None:
    """Limit this process (and what it execs) to writing beneath `writable`.
    Needs no_new_privs set first. Raises OSError; the caller must then not exec."""
    handled = write_accesses(abi)
    ruleset = _call(SYS_CREATE_RULESET, ctypes.byref(_RulesetAttr(handled)),
                    ctypes.c_size_t(ctypes.sizeof(_RulesetAttr)), ctypes.c_uint32(0))
    try:
        for path, access in rules_for(writable, abi):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                attr = _PathBeneathAttr(access, fd)
                _call(SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH),
                      ctypes.byref(attr), ctypes.c_uint32(0))
            finally:
                os.close(fd)
        _call(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)

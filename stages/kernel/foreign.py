"""C functions through ctypes, in the few forms vpnw's callers use.

The recorder of a signed run calls C twice: libsodium (stages/record/sodium.py)
and fallocate(2) for the room kept ahead of the run file
(stages/recorder/reserve.py); the helper, init and the program's process
call prctl, unshare, mount and capset (privileges.py), the seccomp loader
and libseccomp's version (stages/helper/seccomp_rules.py), and the
supervisor its notify calls. They used to go through `_ctypes` alone, with
these types made as ctypes makes them; that bought 0.6-0.7 ms of CPU a
process, under the 1 ms a start-up trick must buy (stages/startup/tricks.py),
so they are ctypes' own again, under the names the callers use.
"""
from __future__ import annotations

import ctypes
from ctypes import (  # noqa: F401  (the names the callers use: foreign.c_int...)
    POINTER, Structure, addressof, byref, c_char, c_char_p, c_int, c_int64, c_long, c_size_t,
    c_uint, c_ulong, c_ulonglong, c_ushort, c_void_p, get_errno, sizeof,
)


def buffer(size: int):
    """`size` zeroed bytes C may write (ctypes.create_string_buffer(size));
    `.raw` reads them back."""
    return (c_char * size)()


_libc = None


def libc() -> Library:
    """The C library (the process's own symbols, as ctypes.CDLL(None,
    use_errno=True)), opened once for every module that calls it."""
    global _libc
    if _libc is None:
        _libc = Library(None, use_errno=True)
    return _libc


class Library:
    """A shared library, dlopen'd now (`name` None: the program itself, as
    ctypes.CDLL(None)). Raises OSError when it cannot be loaded."""

    def __init__(self, name: str | None, use_errno: bool = False):
        self._name = name
        self._library = ctypes.CDLL(name, use_errno=use_errno)

    def function(self, name: str, argtypes: tuple, restype=c_int):
        """The library's `name`, called with `argtypes` (ctypes' conversions)
        and returning `restype` (None: void). Raises AttributeError when the
        library has no such symbol (as ctypes does)."""
        fn = self._library[name]        # a new function object each time (CDLL's getattr caches one)
        fn.argtypes = argtypes
        fn.restype = restype
        return fn

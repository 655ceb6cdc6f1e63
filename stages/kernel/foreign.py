"""C functions called through `_ctypes` alone, without the `ctypes` package.

The recorder of a signed run calls C twice: libsodium (stages/record/sodium.py)
and fallocate(2) for the room kept ahead of the run file
(stages/recorder/reserve.py). `import ctypes` costs about 2 ms of CPU on this
kind of machine beyond the `_ctypes` extension it is built on (its Python
half makes some sixty classes), on the recorder's way to run.start, which
the program waits for (docs/architecture.md, "Start-up budget"). These few
types are made exactly as ctypes makes them (`class c_int(_SimpleCData):
_type_ = "i"`), so the calls convert their arguments as ctypes' would.
The helper, init and the program's process use it too (privileges.py's
prctl, unshare, mount and capset; the seccomp loader and libseccomp's
version, stages/helper/seccomp_rules.py), on their way to the seal.
"""
from __future__ import annotations

import _ctypes


class c_int(_ctypes._SimpleCData):
    _type_ = "i"


class c_uint(_ctypes._SimpleCData):
    _type_ = "I"


class c_ushort(_ctypes._SimpleCData):
    _type_ = "H"


class c_long(_ctypes._SimpleCData):
    _type_ = "l"


class c_ulong(_ctypes._SimpleCData):
    _type_ = "L"


# As ctypes has them: where long is 64 bits, int64 and unsigned long long are long's.
if _ctypes.sizeof(c_long) == 8:
    c_int64, c_ulonglong = c_long, c_ulong
else:                                            # pragma: no cover - ILP32
    class c_int64(_ctypes._SimpleCData):
        _type_ = "q"

    class c_ulonglong(_ctypes._SimpleCData):
        _type_ = "Q"


c_size_t = c_ulong      # size_t on Linux's LP64 and ILP32 alike, as ctypes has it


class c_void_p(_ctypes._SimpleCData):
    _type_ = "P"


class c_char_p(_ctypes._SimpleCData):
    _type_ = "z"


class c_char(_ctypes._SimpleCData):
    _type_ = "c"


get_errno = _ctypes.get_errno
addressof = _ctypes.addressof
byref = _ctypes.byref
sizeof = _ctypes.sizeof
POINTER = _ctypes.POINTER
Structure = _ctypes.Structure


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
        self._handle = _ctypes.dlopen(name, 0)      # ctypes' DEFAULT_MODE (RTLD_LOCAL; NOW added by _ctypes)
        flags = _ctypes.FUNCFLAG_CDECL | (_ctypes.FUNCFLAG_USE_ERRNO if use_errno else 0)

        class Function(_ctypes.CFuncPtr):
            _flags_ = flags
            _restype_ = c_int
        self._function = Function

    def function(self, name: str, argtypes: tuple, restype=c_int):
        """The library's `name`, called with `argtypes` (ctypes' conversions)
        and returning `restype` (None: void). Raises AttributeError when the
        library has no such symbol (as ctypes does)."""
        fn = self._function((name, self))
        fn.argtypes = argtypes
        fn.restype = restype
        return fn

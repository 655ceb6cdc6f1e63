"""The imports vpnw makes through stand-ins (stages/startup/stand_ins.py):
each function imports one library the way the start-up budget needs
(docs/architecture.md, "Start-up budget"); its docstring says what is
stood in for, and why."""
from __future__ import annotations

import os

from stages import startup
from stages.startup.stand_ins import inert, stand_in


def import_pyseccomp() -> None:
    """pyseccomp, imported with ctypes.util and typing stood in for (below);
    with the tricks off, a plain import."""
    if not startup.ON:
        import pyseccomp  # noqa: F401  (the tricks off: the plain import; the helper's, only where the filter is not cached)
        return
    with _sonames_known():
        with _typing_for_pyseccomp():
            import pyseccomp  # noqa: F401  (here, so its import alone sees the stand-ins)


def _sonames_known() -> stand_in:
    """pyseccomp finds libc and libseccomp with ctypes.util.find_library at
    import: importing ctypes.util (shutil, bz2, lzma, subprocess, tempfile...)
    and running `ldconfig -p` twice cost ~30 ms on the way to the seal. While
    it imports, ctypes.util is a stand-in whose find_library tries the usual
    sonames first (the dynamic loader resolves them to the very files ldconfig
    would name) and otherwise asks the real ctypes.util, as before."""
    import ctypes       # only where pyseccomp is imported (the filter not cached)

    def find_library(name):
        soname = _KNOWN_SONAMES.get(name)
        if soname is not None:
            try:
                ctypes.CDLL(soname)
                return soname
            except OSError:
                pass
        return standing.real("find_library")(name)

    standing = stand_in("ctypes.util", find_library=find_library)
    return standing


_KNOWN_SONAMES = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}


def _typing_for_pyseccomp() -> stand_in:
    """pyseccomp imports typing (~4 ms of the helper's CPU before the plan)
    for its annotations, `cast` and `@overload` alone: nothing else in the
    helper needs typing. While pyseccomp imports, `typing` is a stand-in whose
    annotations are inert, `cast` returns its value and `overload` its
    function; any other name loads the real typing (as before), and so
    does any import of typing after this."""
    return stand_in("typing", Any=inert, Collection=inert, Iterable=inert, Union=inert,
                    cast=lambda _type, value: value, overload=lambda function: function)


def import_orjson():
    """orjson, imported with four stand-ins (docs/architecture.md, "Start-up
    budget", 3), each only while orjson imports; any import of the module
    after is the real one.

    - `inspect` and `copy`: orjson loads dataclasses (to know a dataclass
      when it sees one), and dataclasses imports inspect (ast, dis,
      tokenize...) for one use, a dataclass made without a docstring gets
      its signature as one, and copy (and with it weakref) for asdict's and
      astuple's deepcopy. Each stand-in loads the real module the first time
      any of its names is asked for (dataclasses keeps them, so that
      docstring and those copies come out the same).
    - `platform`: orjson takes uuid.UUID, and uuid imports platform (nine
      regular expressions compiled at import) for `platform.system()` alone,
      which on Linux is `os.uname().sysname`: the stand-in's answer.
    - `datetime`: orjson takes the datetime C API's capsule, which the C
      module `_datetime` holds and datetime only re-exports (after defining
      its whole pure-Python version first): the stand-in holds that capsule,
      so orjson's date and time types are datetime's own.

    vpnw imports this on its way to the recorder's fork. With the tricks
    off, a plain import."""
    if not startup.ON:
        import orjson       # the tricks off: the plain import, where the lean one is
        return orjson
    import _datetime        # the C half, for its capsule alone (above)
    with stand_in("inspect"), stand_in("copy"), stand_in("platform", system=_system), \
            stand_in("datetime", datetime_CAPI=_datetime.datetime_CAPI):
        import orjson       # with the stand-ins above standing: this function's purpose
    return orjson


def _system() -> str:
    return os.uname().sysname

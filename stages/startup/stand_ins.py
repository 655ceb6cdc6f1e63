"""A module stood in for while another imports: start-up's one mechanism.

Some libraries import a heavy module for a few names at import time
(pyseccomp: typing for `cast` and `overload`, ctypes.util for
find_library; orjson, through dataclasses: inspect for one docstring;
asyncio, for the broker's loop: stages/startup/lean_asyncio.py).
On the way to the seal those imports cost milliseconds that no run uses
(docs/architecture.md, "Start-up budget"). `stand_in(name, **names)` puts
a module with just `names` in sys.modules for the `with` block; any other
name asked of it loads the real module (which then takes the stand-in's
place in sys.modules, so the stand-in never hides the real one from a later
import), and so does any import of `name` after the block. A stood-in submodule (`concurrent.futures`)
not loaded by the block's end leaves its package loading the real one the
first time it is asked for it (`concurrent.futures.Future` in code that
imported it while the stand-in stood).
"""
from __future__ import annotations

import sys
import types

from stages import startup


class stand_in:        # noqa: N801 - used as `with stand_in(...)`, as a function
    """`with stand_in("typing", cast=...): import pyseccomp`. Nothing is
    stood in when the real module is loaded already, nor with the tricks
    off (`startup.ON`): the block's imports are then plain imports."""

    def __init__(self, name: str, **names):
        self.name, self.names = name, names
        self.module: types.ModuleType | None = None

    def __enter__(self) -> types.ModuleType | None:
        if not startup.ON or self.name in sys.modules:
            return None
        module = self.module = types.ModuleType(self.name)
        module.__dict__.update(self.names)
        module.__getattr__ = self.real
        sys.modules[self.name] = module
        self._set_on_package(module)
        return module

    def real(self, attribute: str):
        """A name the stand-in lacks: from the real module, loaded now."""
        if attribute.startswith("__"):      # the import system asks for __path__ and such
            raise AttributeError(attribute)
        self._leave()
        __import__(self.name)
        return getattr(sys.modules[self.name], attribute)

    def __exit__(self, *_exc) -> None:
        self._leave()
        if self.module is not None and self.name not in sys.modules:
            self._real_on_package_use()

    def _leave(self) -> None:
        if self.module is None:
            return
        if sys.modules.get(self.name) is self.module:
            del sys.modules[self.name]
        package, _, child = self.name.rpartition(".")
        if package and getattr(sys.modules.get(package), child, None) is self.module:
            delattr(sys.modules[package], child)

    def _real_on_package_use(self) -> None:
        # `import concurrent.futures` binds `concurrent`, and the code that
        # did it asks for `concurrent.futures` later: with the stand-in gone
        # and the real module not loaded, the package loads it then.
        package, _, child = self.name.rpartition(".")
        if not package or package not in sys.modules:
            return
        owner = sys.modules[package]
        before = owner.__dict__.get("__getattr__")
        name = self.name

        def __getattr__(attribute: str):    # noqa: N807 - a module's own (PEP 562)
            if attribute == child:
                __import__(name)
                return sys.modules[name]
            if before is not None:
                return before(attribute)
            raise AttributeError(f"module {package!r} has no attribute {attribute!r}")
        owner.__getattr__ = __getattr__

    def _set_on_package(self, module: types.ModuleType) -> None:
        # `import ctypes.util` binds the attribute too: `ctypes.util.x` must
        # find the stand-in while it stands.
        package, _, child = self.name.rpartition(".")
        if package and package in sys.modules:
            setattr(sys.modules[package], child, module)


class Inert:
    """A stood-in annotation that means nothing: `inert[anything]` is itself."""

    def __getitem__(self, _arguments):
        return self


inert = Inert()

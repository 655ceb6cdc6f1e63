"""asyncio imported without the modules it loads but the broker's loop
uses only when something goes wrong, or not at all.

asyncio's import loads inspect (with ast and dis), logging (with traceback,
linecache, tokenize, textwrap, string), concurrent.futures, subprocess
(with locale), typing and contextlib: about 40% of the loop import's CPU,
and a program's first connection waits for the rest of that import
(docs/architecture.md, "Start-up budget"). asyncio's own import touches a
handful of their names; everything else it uses from them inside
functions: to log an error, to make a name lookup's thread pool, to wrap a
concurrent future, to start a subprocess (never, here).

So while asyncio imports, and only then, each is a stand-in
(stages/startup/stand_ins.py) holding just the names that import asks for,
each the same value or function as the real one's:

- inspect: `isgenerator` (the C accelerator _asyncio takes it when loaded)
  and `iscoroutinefunction` (asyncio.coroutines', which add_signal_handler
  asks as the loop starts; asked of anything but a function or a method, it
  loads the real inspect);
- traceback: `extract_stack` (the same; it runs only in asyncio's debug mode);
- subprocess: `PIPE`, `STDOUT`, `DEVNULL` (asyncio.subprocess's constants, and
  default arguments);
- concurrent.futures: `FIRST_COMPLETED`, `FIRST_EXCEPTION`, `ALL_COMPLETED`
  (asyncio.tasks);
- logging: `DEBUG` (asyncio.futures) and `getLogger` (asyncio.log's logger,
  which is the real "asyncio" logger, logging loaded, from its first use
  but for debug and info lines while nothing has loaded logging: a fresh
  logging drops those);
- linecache, contextlib and asyncio.sslproto: no names (used inside
  functions only; sslproto's only for TLS, which the direct path's broker
  never speaks);
- typing: `final` (as typing's: it marks the class), and inert annotations
  for asyncio.staggered's and asyncio.timeouts' signatures (as the helper's
  for pyseccomp): the one place where what asyncio keeps is not typing's.

Any other name asked of a stand-in loads the real module, and any import of
one after asyncio's is the real module: the first error asyncio logs loads
logging, the first name the broker looks up through its threads loads
concurrent.futures (itself with logging stood in: thread_pool_executor).
tests/test_lean_asyncio.py pins what the import loads and that each of
those paths still gets the real thing.
"""
from __future__ import annotations

import sys
import types

from stages import startup
from stages.startup.stand_ins import inert, stand_in


def _isgenerator(object) -> bool:       # noqa: A002 - inspect.isgenerator's own body
    """inspect.isgenerator, as the real one is."""
    return isinstance(object, types.GeneratorType)


_CO_COROUTINE = 0x80        # inspect.CO_COROUTINE


def _iscoroutinefunction(object) -> bool:     # noqa: A002 - inspect's name for it
    """inspect.iscoroutinefunction's answer. For a function or a method of
    one (what the loop's add_signal_handler asks about the broker's SIGTERM
    callback as it starts) from the code's flags, as inspect reads it;
    anything else (a partial, a marked function, a callable object) from
    the real inspect."""
    function = object
    while isinstance(function, types.MethodType):
        function = function.__func__
    if type(function) is types.FunctionType and not hasattr(function, "_is_coroutine_marker"):
        return bool(function.__code__.co_flags & _CO_COROUTINE)
    import inspect      # the real one, for what this stand-in cannot answer
    return inspect.iscoroutinefunction(object)


def _extract_stack(f=None, limit=None):
    """traceback.extract_stack, from the caller's frame as the real one takes it."""
    import traceback    # the real one, asked for at last (asyncio's debug mode)
    return traceback.extract_stack(sys._getframe(1) if f is None else f, limit)


def _dropped(*_args, **_kwargs) -> None:
    return None


class _LoggerOnUse:
    """logging.getLogger(name), made (logging loaded) when first used. Until
    logging is loaded nothing has configured it, and a fresh logging drops
    debug and info lines (the root logger's WARNING): so do these, unloaded
    (the loop logs its selector at debug as it starts)."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def _real(self):
        import logging      # the real logger, on its first use (the class's purpose)
        return logging.getLogger(object.__getattribute__(self, "_name"))

    def __getattr__(self, attribute: str):
        if attribute in ("debug", "info") and "logging" not in sys.modules:
            return _dropped
        return getattr(self._real(), attribute)

    def __setattr__(self, attribute: str, value) -> None:
        setattr(self._real(), attribute, value)

    def __repr__(self) -> str:
        return repr(self._real())


def _final(f):
    """typing.final, as the real one is."""
    try:
        f.__final__ = True
    except (AttributeError, TypeError):
        pass
    return f


def _stand_ins() -> list[stand_in]:
    return [
        stand_in("inspect", isgenerator=_isgenerator, iscoroutinefunction=_iscoroutinefunction),
        stand_in("traceback", extract_stack=_extract_stack),
        stand_in("subprocess", PIPE=-1, STDOUT=-2, DEVNULL=-3),
        stand_in("concurrent.futures", FIRST_COMPLETED="FIRST_COMPLETED",
                 FIRST_EXCEPTION="FIRST_EXCEPTION", ALL_COMPLETED="ALL_COMPLETED"),
        stand_in("logging", DEBUG=10, getLogger=_LoggerOnUse),
        stand_in("linecache"),      # asyncio.base_tasks's, for printing a task's stack
        stand_in("contextlib"),     # asyncio.staggered's, inside its function
        stand_in("asyncio.sslproto"),   # TLS's protocol (two enums), made only for TLS
        stand_in("typing", final=_final, **dict.fromkeys(
            ("Any", "Awaitable", "Callable", "Iterable", "List", "Optional", "Tuple", "Type"), inert)),
    ]


def thread_pool_executor():
    """concurrent.futures.ThreadPoolExecutor, for the broker's name lookups
    (connector.LookupThreads: the run's first lookup imports it), with
    logging stood in as for asyncio's import: concurrent.futures' logger is
    made on its first use (a callback that raises), so that lookup does not
    wait for logging, traceback and the rest (~10 ms of CPU here)."""
    with stand_in("logging", getLogger=_LoggerOnUse):
        # at the first lookup, not before (a run may never look a name up)
        from concurrent.futures import ThreadPoolExecutor
    return ThreadPoolExecutor


def import_asyncio(without_ssl: bool = False):
    """`import asyncio`, with the stand-ins above while it imports.

    `without_ssl` (the direct path's broker, which never speaks TLS):
    `import ssl` refused while asyncio loads, which asyncio takes as "no
    TLS here"; ssl and OpenSSL's libraries were about a quarter of this
    import, and a program that connects at once waits for the rest of it.
    None in sys.modules makes `import ssl` raise ImportError; once asyncio
    is in, ssl imports as any module does.

    With the tricks off (`startup.ON` false): a plain `import asyncio`."""
    if "asyncio" in sys.modules:
        return sys.modules["asyncio"]
    if not startup.ON:
        import asyncio      # the tricks off: the plain import, here where the lean one is
        return asyncio
    refused = without_ssl and "ssl" not in sys.modules
    if refused:
        sys.modules["ssl"] = None
    # the package, so `concurrent.futures` finds its stand-in
    import concurrent   # noqa: F401
    standing = _stand_ins()
    try:
        for one in standing:
            one.__enter__()
        import asyncio      # with the stand-ins above standing: this module's purpose
    finally:
        for one in standing:
            one.__exit__()
        if refused and sys.modules.get("ssl", 0) is None:
            del sys.modules["ssl"]
    return asyncio

"""Records of named fields with defaults: what the run's dataclasses gave
(keyword or positional construction, defaults, equality and repr by field,
frozen on request), made without the `dataclasses` module; and `NamedTuple`,
typing.NamedTuple's class syntax without the `typing` module.

The records on the way to the helper's fork (the policy, the paths, the
run's request) used to be dataclasses; importing `dataclasses` loads
`inspect` (with ast, dis, tokenize), ~13 ms of every `vpnw run` before the
seal, and each dataclass execs its generated methods when its module loads
(docs/architecture.md, "Start-up budget"). A subclass here costs one
`__init_subclass__`, a loop over its annotations.

    class PathSpec(FrozenRecord):
        _uncompared = ("secret",)      # field(compare=False)
        _unshown = ("password",)       # field(repr=False)
        name: str
        port: int | None = None        # a class attribute is the field's default

A mutable default (a list, a dict) is given as `Factory(list)`: each record
gets its own. `__post_init__`, when a class has one, runs after the fields
are set (as in a dataclass).

With the tricks off (`startup.ON` false, stages/startup/__init__.py) each
subclass is made a real `dataclasses.dataclass` (frozen for a FrozenRecord;
a default as the field's default, a Factory as its default_factory, an
uncompared field `field(compare=False)`, an unshown one `field(repr=False)`)
and `NamedTuple` is typing's own.
"""
from __future__ import annotations

from collections import namedtuple

from stages import startup

if not startup.ON:
    import dataclasses
    import typing


class Factory:
    """A default made fresh for each record (dataclasses' default_factory)."""
    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


_NO_DEFAULT = object()


class Record:
    """Named fields, set once by __init__; compared and shown by field."""
    _fields: tuple = ()
    _defaults: dict = {}
    _uncompared: tuple = ()
    _unshown: tuple = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = tuple(cls.__dict__.get("__annotations__", {}))
        cls._fields = cls._fields + tuple(name for name in own if name not in cls._fields)
        defaults = dict(cls._defaults)
        for name in own:
            if name in cls.__dict__:
                defaults[name] = cls.__dict__[name]
                delattr(cls, name)       # the instance's value, never the class's, is read
        cls._defaults = defaults
        cls._compared = tuple(name for name in cls._fields if name not in cls._uncompared)
        cls._shown = tuple(name for name in cls._fields if name not in cls._unshown)
        if not startup.ON and cls.__module__ != __name__:     # not FrozenRecord itself
            _as_dataclass(cls, own, {name: defaults[name] for name in own if name in defaults})

    def __init__(self, *args, **kwargs):
        cls = type(self)
        if len(args) > len(cls._fields):
            raise TypeError(f"{cls.__name__} takes at most {len(cls._fields)} fields")
        values = dict(zip(cls._fields, args))
        for name in cls._fields[len(args):]:
            value = kwargs.pop(name, _NO_DEFAULT)
            if value is _NO_DEFAULT:
                value = cls._defaults.get(name, _NO_DEFAULT)
                if value is _NO_DEFAULT:
                    raise TypeError(f"{cls.__name__} needs {name}")
                if isinstance(value, Factory):
                    value = value.make()
            values[name] = value
        if kwargs:
            raise TypeError(f"{cls.__name__} has no field {sorted(kwargs)[0]}")
        self.__dict__.update(values)
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    def _key(self) -> tuple:
        return tuple(self.__dict__[name] for name in self._compared)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None       # mutable: as a dataclass with eq and not frozen

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={self.__dict__[name]!r}" for name in self._shown)
        return f"{type(self).__name__}({shown})"

    def replace(self, **changes):
        """A copy with `changes` (dataclasses.replace)."""
        return type(self)(**{**{name: self.__dict__[name] for name in self._fields}, **changes})


class FrozenRecord(Record):
    """A Record whose fields cannot be set again; hashable by the compared
    fields (a frozen dataclass). __post_init__ sets a derived field with
    object.__setattr__, as in a frozen dataclass."""

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field {name!r} of a {type(self).__name__}")

    def __delattr__(self, name):
        raise AttributeError(f"cannot delete field {name!r} of a {type(self).__name__}")

    def __hash__(self):
        return hash(self._key())


def _as_dataclass(cls, own: tuple, own_defaults: dict) -> None:
    """`cls` made a dataclass in place, with the fields its annotations and
    class attributes described (the tricks off)."""
    for name in own:
        settings = {"compare": name not in cls._uncompared, "repr": name not in cls._unshown}
        if name in own_defaults:
            default = own_defaults[name]
            if isinstance(default, Factory):
                settings["default_factory"] = default.make
            else:
                settings["default"] = default
        setattr(cls, name, dataclasses.field(**settings))
    dataclasses.dataclass(cls, frozen=issubclass(cls, FrozenRecord))


class _NamedTupleMeta(type):
    def __new__(mcls, name, bases, namespace):
        if not bases:
            return super().__new__(mcls, name, bases, namespace)
        fields = tuple(namespace.get("__annotations__", {}))
        defaults = [namespace[field] for field in fields if field in namespace]
        if any(field not in namespace for field in fields[len(fields) - len(defaults):]):
            raise TypeError(f"{name}: a field without a default follows one with a default")
        made = namedtuple(name, fields, defaults=defaults, module=namespace["__module__"])
        for key, value in namespace.items():
            if key not in fields and key not in _NOT_COPIED:
                setattr(made, key, value)
        made.__qualname__ = namespace.get("__qualname__", name)
        return made


_NOT_COPIED = {"__module__", "__qualname__", "__annotations__", "__dict__", "__weakref__"}


class _LeanNamedTuple(metaclass=_NamedTupleMeta):
    """`class Rule(NamedTuple):` with annotated fields, defaults, methods and
    a docstring, as typing.NamedTuple: the class made is a
    collections.namedtuple. Without `typing`, whose import is ~4 ms of CPU
    on the way to the helper's fork and again in the helper (docs/architecture.md,
    "Start-up budget")."""


NamedTuple = _LeanNamedTuple if startup.ON else typing.NamedTuple

"""Status messages: what the stages tell the orchestrator, and init the helper.

The one place that says what a status message is, as `record.py` is for
events. Each message is an immutable type; `encode` writes it as one JSON
line, `decode` reads a line back and accepts only the kinds the reader
expects, with every field of the right type and size; `encode` checks what it
writes with the same code, so nothing is sent that would be refused. Anything else raises `StatusError`:
the helper shares a namespace with the program it guards, so, like OpenSSH's
monitor, the orchestrator re-checks every message and permits only the ones
it expects (docs/architecture.md, "Status messages").

Channels and the kinds each may carry:

    helper -> orchestrator   HELPER_STATUS   Ready, Stopped, UnixConnect, LoopbackRefused,
                                             SandboxFailed, ExecFailed, Exited
    init   -> helper         INIT_REPORT     InitOk, InitFailed, Stopped, SandboxFailed, ExecFailed,
                                             Exited
    program's process -> init (before exec)  PROGRAM_REPORT  SandboxFailed, ExecFailed
    broker -> orchestrator   BROKER_STATUS   PathOk, PathDown, Totals

The wire form of each kind is written beside it; a kind is told by its exact
set of keys, so a message with a key too many is not a message.

The types are immutable tuples with named fields (`_Message`), not frozen
dataclasses or NamedTuples: this module is imported on the way of every
`vpnw run`, and making nine frozen dataclasses costs ~5 ms there, nine
NamedTuples ~0.4 ms (an eval each), nine `_Message`s ~0.05 ms. Equality is
by kind as well as value: a PathDown is never equal to a plain tuple or to
another kind.

The JSON is the standard library's, not orjson: the helper writes and reads
these lines on its way to Ready, and orjson's import loads dataclasses,
inspect, uuid, platform and datetime (~10 ms before the seal). The bytes are
orjson's (compact, UTF-8, no escapes beyond JSON's own), and a line is read
as strictly: UTF-8 only, no NaN or Infinity, no lone surrogate (`_text`).
It is the standard library's C half, `_json`, that json.JSONEncoder and
JSONDecoder use for these settings: the `json` package itself imports `re`
(~6 ms), which nothing else on the helper's way to Ready needs.
"""
from stages.startup import json_c as _json   # _json, or json with the tricks off
import operator
import os

from stages.wire.exits import ExitCode

# Far above any real message (an error sentence, a seal report), small enough
# that a runaway writer cannot make the reader hold much.
MAX_LINE = 16384
MAX_TEXT = 4096


class StatusError(ValueError):
    """A line that is not a status message this reader expects."""


# --------------------------------------------------------------- field checks

def _clip(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "…"


def _text(value, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise StatusError(f"{what} must be a string of at most {MAX_TEXT} characters, not {_clip(value)}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise StatusError(f"{what} must be text (UTF-8), not {_clip(value)}") from None
    return value


def _int(value, what: str, low: int, high: int) -> int:
    # bool is an int to Python, never to us.
    if type(value) is not int or not low <= value <= high:
        raise StatusError(f"{what} must be a whole number from {low} to {high}, not {_clip(value)}")
    return value


def _bool(value, what: str) -> bool:
    if type(value) is not bool:
        raise StatusError(f"{what} must be true or false, not {_clip(value)}")
    return value


def _code(value, codes: tuple[ExitCode, ...]) -> ExitCode:
    if type(value) is not int or value not in codes:
        raise StatusError(f"code must be one of {[int(c) for c in codes]}, not {_clip(value)}")
    return ExitCode(value)


_SANDBOX_CODES = (ExitCode.NO_SANDBOX, ExitCode.INTERNAL)
_EXEC_CODES = (ExitCode.CANNOT_EXECUTE, ExitCode.NOT_FOUND)


def _object(value, what: str, keys: set[str]) -> dict:
    if not isinstance(value, dict) or set(value) != keys:
        raise StatusError(f"{what} must be an object with exactly {sorted(keys)}, not {_clip(value)}")
    return value


# --------------------------------------------------------------- the kinds

class _Message(tuple):
    """An immutable message: a tuple of the fields a subclass annotates, in
    order, each readable by name; a class attribute is that field's default."""
    __slots__ = ()
    _fields: tuple = ()
    _defaults: dict = {}

    def __init_subclass__(cls):
        cls._fields = tuple(cls.__dict__.get("__annotations__", {}))
        cls._defaults = {name: cls.__dict__[name] for name in cls._fields if name in cls.__dict__}
        for index, name in enumerate(cls._fields):
            setattr(cls, name, property(operator.itemgetter(index)))

    def __new__(cls, *args, **kwargs):
        if len(args) > len(cls._fields):
            raise TypeError(f"{cls.__name__} takes {len(cls._fields)} fields")
        values = list(args)
        for name in cls._fields[len(args):]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in cls._defaults:
                values.append(cls._defaults[name])
            else:
                raise TypeError(f"{cls.__name__} needs {name}")
        if kwargs:
            raise TypeError(f"{cls.__name__} has no field {sorted(kwargs)[0]}")
        return tuple.__new__(cls, values)

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and tuple.__eq__(self, other)

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={v!r}' for n, v in zip(self._fields, self))})"

    def __getnewargs__(self):
        return tuple(self)


_KINDS: dict = {}


def _kind(*keys: str):
    """Register a kind by its exact set of wire keys."""
    def register(cls):
        keyset = frozenset(keys)
        assert keyset not in _KINDS, cls
        _KINDS[keyset] = cls
        return cls
    return register


@_kind("ready")
class Ready(_Message):
    """The seal holds and both doors listen; the helper waits for go.
    `{"ready": {"namespaces": [...], "seccomp": true, "unix_sockets": false,
    "unix": "own", "doors": {"http": 3128, "socks": 1080}}}`; `local`: the
    ports `localhost:PORT` rules opened on the sandbox's loopback (sent only
    when there are some)."""
    namespaces: tuple[str, ...]
    seccomp: bool
    unix_sockets: bool
    doors: tuple[tuple[str, int], ...]     # (door, port), as handoff.DOORS
    unix: str = "none"                     # UNIX_MODES: which Unix sockets the program reaches
    local: tuple[int, ...] = ()            # the local doors' ports (localhost:PORT rules)

    def to_wire(self) -> dict:
        return {"ready": {"namespaces": list(self.namespaces), "seccomp": self.seccomp,
                          "unix_sockets": self.unix_sockets, "unix": self.unix,
                          "doors": dict(self.doors), **({"local": list(self.local)} if self.local else {})}}

    @classmethod
    def from_wire(cls, obj: dict) -> "Ready":
        keys = {"namespaces", "seccomp", "unix_sockets", "unix", "doors"}
        body = _object(obj["ready"], "ready", keys | ({"local"} if isinstance(obj["ready"], dict)
                                                      and "local" in obj["ready"] else set()))
        if body["unix"] not in UNIX_MODES:
            raise StatusError(f"ready.unix must be one of {list(UNIX_MODES)}, not {_clip(body['unix'])}")
        names = body["namespaces"]
        if not isinstance(names, list) or len(names) > 16:
            raise StatusError(f"ready.namespaces must be a short list, not {_clip(names)}")
        doors = body["doors"]
        if not isinstance(doors, dict) or len(doors) > 8:
            raise StatusError(f"ready.doors must be a small object, not {_clip(doors)}")
        local = body.get("local", [])
        if not isinstance(local, list) or len(local) > MAX_LOCAL_DOORS:
            raise StatusError(f"ready.local must be a list of at most {MAX_LOCAL_DOORS} ports, "
                              f"not {_clip(local)}")
        return cls(namespaces=tuple(_text(n, "a namespace") for n in names),
                   seccomp=_bool(body["seccomp"], "ready.seccomp"),
                   unix_sockets=_bool(body["unix_sockets"], "ready.unix_sockets"),
                   unix=body["unix"],
                   doors=tuple((_text(door, "a door"), _int(port, "a door's port", 1, 65535))
                               for door, port in doors.items()),
                   local=tuple(_int(port, "a local door's port", 1, 65535) for port in local))


MAX_LOCAL_DOORS = 1024


# "own": sockets bound inside the sandbox and those the policy names (the
# supervisor); "none": no Unix socket but connected pairs (no supervisor on this
# kernel); "all": every socket on the machine (--allow-unix-sockets).
UNIX_MODES = ("own", "none", "all")
MAX_PATH = 512


@_kind("unix")
class UnixConnect(_Message):
    """The supervisor refused a connect() to a Unix socket, or connected one
    the policy names; sent before the program hears the answer.
    `{"unix": {"path": "/run/docker.sock", "allowed": false, "process": 7,
    "program": "curl", "reason": "a socket bound outside the sandbox"}}`"""
    path: str
    allowed: bool
    process: int
    program: str
    reason: str

    def to_wire(self) -> dict:
        return {"unix": {"path": self.path, "allowed": self.allowed, "process": self.process,
                         "program": self.program, "reason": self.reason}}

    @classmethod
    def from_wire(cls, obj: dict) -> "UnixConnect":
        body = _object(obj["unix"], "unix", {"path", "allowed", "process", "program", "reason"})
        path = _text(body["path"], "unix.path")
        if len(path) > MAX_PATH:
            raise StatusError(f"unix.path must be at most {MAX_PATH} characters")
        return cls(path=path, allowed=_bool(body["allowed"], "unix.allowed"),
                   process=_int(body["process"], "unix.process", 0, 2**22),
                   program=_text(body["program"], "unix.program"),
                   reason=_text(body["reason"], "unix.reason"))


@_kind("loopback_refused")
class LoopbackRefused(_Message):
    """The supervisor saw a TCP connect to a port of the sandbox's own
    loopback that nothing there listens on (the kernel refuses it); sent
    once per port, before the program hears the answer. Evidence for the
    closing hint, never a decision.
    `{"loopback_refused": {"port": 11434, "process": 7, "program": "curl"}}`"""
    port: int
    process: int
    program: str

    def to_wire(self) -> dict:
        return {"loopback_refused": {"port": self.port, "process": self.process,
                                     "program": self.program}}

    @classmethod
    def from_wire(cls, obj: dict) -> "LoopbackRefused":
        body = _object(obj["loopback_refused"], "loopback_refused", {"port", "process", "program"})
        return cls(port=_int(body["port"], "loopback_refused.port", 1, 65535),
                   process=_int(body["process"], "loopback_refused.process", 0, 2**22),
                   program=_text(body["program"], "loopback_refused.program"))


@_kind("error", "code")
class SandboxFailed(_Message):
    """The sandbox could not be built or held (122), or the helper itself
    failed (125); the program did not run, or was stopped before exec.
    `{"error": "...", "code": 122}`"""
    error: str
    code: ExitCode

    def to_wire(self) -> dict:
        return {"error": self.error, "code": int(self.code)}

    @classmethod
    def from_wire(cls, obj: dict) -> "SandboxFailed":
        return cls(error=_text(obj["error"], "error"), code=_code(obj["code"], _SANDBOX_CODES))


@_kind("exec_error", "code")
class ExecFailed(_Message):
    """The program could not be executed (126) or was not found (127).
    `{"exec_error": "...", "code": 127}`"""
    error: str
    code: ExitCode

    def to_wire(self) -> dict:
        return {"exec_error": self.error, "code": int(self.code)}

    @classmethod
    def from_wire(cls, obj: dict) -> "ExecFailed":
        return cls(error=_text(obj["exec_error"], "exec_error"), code=_code(obj["code"], _EXEC_CODES))


@_kind("exit")
class Exited(_Message):
    """The program ended: its exit code, or 128+N and N when signal N killed it;
    `no_route`: how many times the sandbox's network refused it a way out (the
    kernel's count of sends and connects with no route: the program went
    around the doors), present only when not 0.
    `{"exit": {"code": 0, "signal": null}}`"""
    code: int
    signal: int | None
    no_route: int = 0

    def to_wire(self) -> dict:
        body = {"code": self.code, "signal": self.signal}
        if self.no_route:
            body["no_route"] = self.no_route
        return {"exit": body}

    @classmethod
    def from_wire(cls, obj: dict) -> "Exited":
        keys = {"code", "signal"} | ({"no_route"} if isinstance(obj["exit"], dict)
                                      and "no_route" in obj["exit"] else set())
        body = _object(obj["exit"], "exit", keys)
        signum = body["signal"]
        return cls(code=_int(body["code"], "exit.code", 0, 255),
                   signal=None if signum is None else _int(signum, "exit.signal", 1, 64),
                   no_route=_int(body.get("no_route", 0), "exit.no_route", 0, 2**53))


@_kind("stopped")
class Stopped(_Message):
    """The program stopped on signal N (Ctrl-Z on its own pty); vpnw stops
    with it, as a shell job. `{"stopped": 20}`"""
    signal: int

    def to_wire(self) -> dict:
        return {"stopped": self.signal}

    @classmethod
    def from_wire(cls, obj: dict) -> "Stopped":
        return cls(signal=_int(obj["stopped"], "stopped", 1, 64))


@_kind("init")
class InitOk(_Message):
    """Init (PID 1 inside) has its fresh /proc and read-only knobs; it waits for go.
    `{"init": "ok"}`"""

    def to_wire(self) -> dict:
        return {"init": "ok"}

    @classmethod
    def from_wire(cls, obj: dict) -> "InitOk":
        if obj["init"] != "ok":
            raise StatusError(f"init must be \"ok\", not {_clip(obj['init'])}")
        return cls()


@_kind("init_error")
class InitFailed(_Message):
    """Init could not set the sandbox up. `{"init_error": "..."}`"""
    error: str

    def to_wire(self) -> dict:
        return {"init_error": self.error}

    @classmethod
    def from_wire(cls, obj: dict) -> "InitFailed":
        return cls(error=_text(obj["init_error"], "init_error"))


@_kind("path_ok")
class PathOk(_Message):
    """The chosen path answered (the broker's first line).
    `{"path_ok": {"path": "direct", "type": "direct", "ms": 0}}`"""
    path: str
    type: str
    ms: int

    def to_wire(self) -> dict:
        return {"path_ok": {"path": self.path, "type": self.type, "ms": self.ms}}

    @classmethod
    def from_wire(cls, obj: dict) -> "PathOk":
        body = _object(obj["path_ok"], "path_ok", {"path", "type", "ms"})
        return cls(path=_text(body["path"], "path_ok.path"), type=_text(body["type"], "path_ok.type"),
                   ms=_int(body["ms"], "path_ok.ms", 0, 2**53))


@_kind("path_down")
class PathDown(_Message):
    """The chosen path does not answer; the program must not start (123).
    `{"path_down": {"path": "office", "error": "..."}}`"""
    path: str
    error: str

    def to_wire(self) -> dict:
        return {"path_down": {"path": self.path, "error": self.error}}

    @classmethod
    def from_wire(cls, obj: dict) -> "PathDown":
        body = _object(obj["path_down"], "path_down", {"path", "error"})
        return cls(path=_text(body["path"], "path_down.path"),
                   error=_text(body["error"], "path_down.error"))


@_kind("totals")
class Totals(_Message):
    """The broker's counts, as its last line.
    `{"totals": {"connections": 3, "denied": 1, "would_deny": 0, "failed": 0}}`"""
    connections: int = 0
    denied: int = 0
    would_deny: int = 0
    failed: int = 0

    def to_wire(self) -> dict:
        return {"totals": {"connections": self.connections, "denied": self.denied,
                           "would_deny": self.would_deny, "failed": self.failed}}

    @classmethod
    def from_wire(cls, obj: dict) -> "Totals":
        body = _object(obj["totals"], "totals", {"connections", "denied", "would_deny", "failed"})
        return cls(**{key: _int(value, f"totals.{key}", 0, 2**53) for key, value in body.items()})


Message = (Ready | UnixConnect | LoopbackRefused | SandboxFailed | ExecFailed | Exited | Stopped | InitOk
           | InitFailed | PathOk | PathDown | Totals)

HELPER_STATUS = (Ready, Stopped, UnixConnect, LoopbackRefused, SandboxFailed, ExecFailed, Exited)
INIT_REPORT = (InitOk, InitFailed, Stopped, SandboxFailed, ExecFailed, Exited)
PROGRAM_REPORT = (SandboxFailed, ExecFailed)
BROKER_STATUS = (PathOk, PathDown, Totals)


# --------------------------------------------------------------- encode/decode

def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _not_json(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
# check_circular=False)'s one-shot encoder, made as it makes it.
_ENCODE = _json.make_encoder(None, _not_json, _json.encode_basestring, None, ":", ",",
                             False, False, False)


class _Reading:
    """What json.JSONDecoder(parse_constant=_no_constant) hands its C scanner."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_no_constant)


_SCAN = _json.make_scanner(_Reading())
_WHITESPACE = " \t\n\r"        # json.decoder's WHITESPACE


def read_json(text: str):
    """One JSON value, as json.JSONDecoder(parse_constant=...).decode reads it
    (JSON's whitespace around it, nothing else; NaN and Infinity refused):
    ValueError when it is not that. Also the helper's reading of nftables'
    listing (capture.py), which then needs no `json` either."""
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _SCAN(text, start)
    except StopIteration:
        raise ValueError("Expecting value") from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError("Extra data")
    return value


def encode(message: Message) -> bytes:
    """One JSON line; StatusError if `message` is not one decode would accept."""
    wire = message.to_wire()
    type(message).from_wire(wire)
    return "".join(_ENCODE(wire, 0)).encode("utf-8") + b"\n"


def decode(line: bytes | str, expect: tuple[type, ...]) -> Message:
    """The message on `line` if it is one of the kinds `expect`; else StatusError."""
    if len(line) > MAX_LINE:
        raise StatusError(f"a status line of {len(line)} bytes (at most {MAX_LINE})")
    try:
        obj = read_json(line.decode("utf-8") if isinstance(line, bytes) else line)
    except (ValueError, RecursionError):     # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise StatusError(f"a status line that is not JSON: {_clip(line)}") from None
    if not isinstance(obj, dict):
        raise StatusError(f"a status line that is not an object: {_clip(obj)}")
    kind = _KINDS.get(frozenset(obj))
    if kind is None:
        raise StatusError(f"an unknown status message with keys {_clip(sorted(obj)[:8])}")
    if kind not in expect:
        raise StatusError(f"a {kind.__name__} message, which this channel does not carry")
    return kind.from_wire(obj)


def write(fd: int, message: Message) -> None:
    """Write one message to a pipe, finishing a short write."""
    data = encode(message)
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue


class StatusReader:
    """Messages from one channel's pipe, line by line.

    `feed()` reads once (non-blocking fds return what is there); `pop()`
    returns the next whole message or None; `next_message()` blocks until a
    message or the end of the stream. A line that is not a message this
    channel carries raises StatusError; so does a line that grows past
    MAX_LINE without ending."""

    def __init__(self, fd: int, expect: tuple[type, ...]):
        self.fd = fd
        self.expect = expect
        self.buf = b""
        self.eof = False

    def feed(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self.eof = True
            return
        self.buf += data
        if len(self.buf) > MAX_LINE and b"\n" not in self.buf:
            raise StatusError(f"a status line longer than {MAX_LINE} bytes")

    def has_message(self) -> bool:
        return b"\n" in self.buf

    def pop(self) -> "Message | None":
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        return decode(line, self.expect)

    def messages(self) -> list[Message]:
        """Read once and return every whole message that is there."""
        self.feed()
        out = []
        while (message := self.pop()) is not None:
            out.append(message)
        return out

    def next_message(self) -> "Message | None":
        """Block for the next message; None at the end of the stream."""
        while not self.has_message() and not self.eof:
            self.feed()
        return self.pop()


# vpnw's go: one byte for the helper and one for the program's sealed
# process, which both wait on the same pipe, so the program execs without a
# hop through the helper; EOF on that pipe: no go, nothing runs
# (docs/architecture.md, "Start-up budget").
GO = b"gg"

"""One immutable type per event kind: what each kind's `fields` hold, typed,
encoded and decoded side by side (as stages/wire/status.py does for status
messages). The envelope (v, ts, type, run, pid, path, conn) and the line's
bytes are events.py's.

A writer constructs the event and hands it to its emitter:

    journal.emit(ConnClose(conn, bytes_up=12, bytes_down=340, ms=51))
    emitter.emit(RunEnd(exit_code=0, connections=3, denied=1, would_deny=0, failed=0, ms=812.5))

A reader may decode a parsed line (events.parse_line) into its type:

    event = decode(parse_line(line))     # ConnClose(conn=7, bytes_up=12, ...)

Each type is a tuple of its fields in the order they are written (the
record's bytes depend on it: the digest chain is over them); a kind about a
connection has `conn` (the envelope's conn) as its first field, positional;
the others are keyword-only and have `conn` None. A field given a default
here is optional: left out of the line when None (a field that is written
as null, `policy` say, has no default). A field's annotation is its JSON
type; tests/test_event_types.py holds each type to schema.json field by
field (names, which are required, JSON types), test_record_schema.py holds
docs/record.md to the schema.

The types are the status messages' tuples (`_Message`), not dataclasses or
NamedTuples: the broker makes several per connection, so each kind's
__new__ and fields() are written out from its annotations when its class is
made (_made_methods, as collections.namedtuple does), and the module loads
no typing on the way to run.start.
"""
import operator

from stages.record.events import EVENT_TYPES, RecordError
from stages.wire import status


class _Event(status._Message):
    """An event's fields as a tuple, each readable by name, compared by kind
    and value (the status messages' tuple, wire/status.py). A subclass
    annotates its fields in the record's order; a class attribute (None)
    makes a field optional. KIND is the envelope's type."""
    __slots__ = ()
    KIND = ""
    conn = None            # the envelope's conn; a connection's kinds have it as their first field
    _names: tuple = ()     # the fields written into "fields" (conn aside)
    _types: dict = {}      # name -> its annotation
    _optional: frozenset = frozenset()
    _start = 0             # where _names begin in the tuple (1 after conn)
    _flat = False          # no list or object among the fields
    _kind_bytes = b""

    def __init_subclass__(cls):
        super().__init_subclass__()        # _fields, _defaults, a property per field
        annotations = cls.__dict__.get("__annotations__", {})
        cls._start = 1 if cls._fields[:1] == ("conn",) else 0
        cls._names = cls._fields[cls._start:]
        cls._types = {name: annotations[name] for name in cls._names}
        cls._optional = frozenset(cls._defaults)
        # Flat: every field a number, a bool, a string or null; such an event
        # whose fields' JSON is at most MAX_FIELD bytes has nothing to clip
        # (events.Emitter's fast path).
        cls._flat = all(set(getattr(kind, "__args__", (kind,))) <= _SCALARS for kind in cls._types.values())
        cls._kind_bytes = cls.KIND.encode()
        cls.__new__, cls.fields = _made_methods(cls)
        _BY_KIND[cls.KIND] = cls

    @classmethod
    def from_fields(cls, fields: dict, conn: int | None = None) -> "_Event":
        """The event a line's fields (and envelope conn) hold: RecordError
        when a field is missing, unknown or not of its type."""
        unknown = fields.keys() - cls._types.keys()
        if unknown:
            raise RecordError(f"{cls.KIND} has no field {sorted(unknown)[0]!r}")
        for name, kind in cls._types.items():
            if name not in fields:
                if name not in cls._optional:
                    raise RecordError(f"{cls.KIND} needs {name!r}")
                continue
            if not _is(fields[name], kind):
                raise RecordError(f"{cls.KIND}.{name} must be {_says(kind)}, not {fields[name]!r:.80}")
        if cls._start:
            if type(conn) is not int:
                raise RecordError(f"{cls.KIND} is about a connection: conn must be a number")
            return cls(conn, **fields)
        if conn is not None:
            raise RecordError(f"{cls.KIND} is about no connection: conn must be null")
        return cls(**fields)


def _made_methods(cls):
    """The kind's __new__ and fields(), written out from its annotations (as
    collections.namedtuple writes its __new__): the broker makes five or so
    events per connection, and a generic loop over the fields cost it ~1.5 us
    an event (scripts/bench/event_cost.py). `conn` positional, every other
    field by keyword; an optional field that is None is left out of fields()."""
    names = cls._names
    given = ["conn"] if cls._start else []
    keywords = [f"{name}=None" if name in cls._optional else name for name in names]
    signature = ", ".join(["cls", *given, *(["*"] if keywords else []), *keywords])
    values = ", ".join([*given, *names]) + ("," if len(given) + len(names) == 1 else "")
    leading = []                  # the required fields before the first optional one: one literal
    for name in names:
        if name in cls._optional:
            break
        leading.append(name)
    unpack = ", ".join([*(["_"] if cls._start else []), *names]) + ("," if len(given) + len(names) == 1 else "")
    body = ["def fields(self):", f"    {unpack} = self" if names else "    pass",
            "    out = {" + ", ".join(f"{name!r}: {name}" for name in leading) + "}"]
    for name in names[len(leading):]:           # in order: the record's bytes depend on it
        test = f"if {name} is not None: " if name in cls._optional else ""
        body.append(f"    {test}out[{name!r}] = {name}")
    body += ["    return out"]
    source = (f"def __new__({signature}):\n    return _tuple_new(cls, ({values}))\n"
              + "\n".join(body) + "\n")
    space = {"_tuple_new": tuple.__new__}
    exec(source, space)          # noqa: S102 - our own annotations, as namedtuple does
    return space["__new__"], space["fields"]


_BY_KIND: dict = {}
_SCALARS = {str, int, float, bool, type(None)}


def _is(value, kind) -> bool:
    """Whether a JSON value is of a field's annotated type (bool is never a number)."""
    for one in getattr(kind, "__args__", (kind,)) if type(kind) is not type else (kind,):
        if one is None or one is type(None):
            if value is None:
                return True
        elif one is float:
            if type(value) in (int, float):
                return True
        elif type(value) is one:
            return True
    return False


def _says(kind) -> str:
    return getattr(kind, "__name__", None) or str(kind)


# ------------------------------------------------------------- the kinds
# In the order a run produces them (events.EVENT_TYPES). Which stage writes
# each, and what each field means: docs/record.md. Each kind's __new__ and
# fields() are made from its annotations when the class is made
# (_Event._made_methods).

class RunStart(_Event):
    """The run begins (the orchestrator)."""
    KIND = "run.start"
    mode: str
    program: str
    policy: str | None
    policy_file: str | None
    via: str
    config: str = None
    dry_run: bool
    allow_unix_sockets: bool
    version: str
    record: str
    files: dict = None
    env_kept: list = None
    deny_private_scope: str = None
    deny_private_shadows: dict = None
    capture: bool = None                   # True or absent
    ask: bool = None                       # True or absent
    unix_allow: list = None
    unix_allow_unlisted: int = None
    work_set: dict = None
    secrets: list = None
    keys_given: list = None
    protected: dict = None
    cut: dict = None                       # events.encode's, when the line was shortened


class PathCheck(_Event):
    """The chosen path was checked before the program starts (the broker)."""
    KIND = "path.check"
    path: str
    type: str
    ok: bool
    ms: float
    error: str = None


class SandboxReady(_Event):
    """The helper sealed the sandbox: what the seal holds (the orchestrator)."""
    KIND = "sandbox.ready"
    namespaces: list
    seccomp: bool
    unix_sockets: bool
    unix: str = None
    doors: dict
    local_doors: list = None


class ConnRequest(_Event):
    """A client asked a door for host:port."""
    KIND = "conn.request"
    conn: int
    door: str
    kind: str
    host: str
    port: int
    fake_address: str = None
    secret: str = None


class DnsResolve(_Event):
    """A name was looked up (only when an address could change the answer)."""
    KIND = "dns.resolve"
    conn: int
    host: str
    addresses: list
    ms: float
    error: str = None
    server: str = None


class DnsAnswer(_Event):
    """The DNS door answered a query (capture); nothing was looked up."""
    KIND = "dns.answer"
    name: str
    type: str
    transport: str
    rcode: str
    address: str = None
    reason: str = None


class PolicyAllow(_Event):
    """The policy allowed the request; `by`, `answer`, `scope`: guard --ask's."""
    KIND = "policy.allow"
    conn: int
    rule: str
    reason: str
    host: str
    port: int
    door: str
    by: str = None
    answer: str = None
    scope: str = None


class PolicyDeny(_Event):
    """The policy denied the request, or (enforced false, --dry-run) would
    have; `method` and `path`: a secret door's refused request."""
    KIND = "policy.deny"
    conn: int
    rule: str
    reason: str
    enforced: bool
    host: str
    port: int
    door: str
    by: str = None
    answer: str = None
    scope: str = None
    method: str = None
    path: str = None


class ConnOpen(_Event):
    """The destination was dialled and the relay started."""
    KIND = "conn.open"
    conn: int
    address: str
    port: int
    via: str
    ms: float


class ConnFail(_Event):
    """The connection could not be made, or its handshake was bad."""
    KIND = "conn.fail"
    conn: int
    stage: str
    error: str
    reason: str


class ConnClose(_Event):
    """An opened connection ended: its byte counts and how long it lasted."""
    KIND = "conn.close"
    conn: int
    bytes_up: int
    bytes_down: int
    ms: float


class UnixAllow(_Event):
    """The supervisor connected a Unix socket the policy names (the orchestrator)."""
    KIND = "unix.allow"
    path: str
    process: int
    program: str
    rule: str


class UnixDeny(_Event):
    """The supervisor refused a Unix socket bound outside (the orchestrator)."""
    KIND = "unix.deny"
    path: str
    process: int
    program: str
    reason: str


class ProgramExit(_Event):
    """The program ended, by its code or a signal (the orchestrator)."""
    KIND = "program.exit"
    code: int | None
    signal: int | None
    no_route: int = None
    loopback_refused: list = None


class FilesHeld(_Event):
    """What the program wrote outside its work set, held (the orchestrator)."""
    KIND = "files.held"
    count: int
    entries: list
    truncated: bool
    unlisted: int = None


class RunEnd(_Event):
    """The run is over: totals and vpnw's exit code (the orchestrator; the
    recorder adds what its copies lost)."""
    KIND = "run.end"
    exit_code: int
    connections: int
    denied: int
    would_deny: int
    failed: int
    ms: float
    error: str = None
    events_to_lost: int = None
    syslog_lost: int = None


class Truncated(tuple):
    """A line whose fields were too long to keep (events.encode wrote
    {"truncated": true} instead): its kind and conn only."""
    __slots__ = ()
    kind = property(operator.itemgetter(0))
    conn = property(operator.itemgetter(1))

    def __new__(cls, kind: str, conn: int | None):
        return tuple.__new__(cls, (kind, conn))


assert tuple(_BY_KIND) == EVENT_TYPES, "one type per kind, in EVENT_TYPES's order"
TYPES = tuple(_BY_KIND.values())
# The kinds about one connection (their envelope's conn is its number).
ABOUT_A_CONNECTION = frozenset(cls.KIND for cls in TYPES if cls._start)


def decode(event: dict) -> "_Event | Truncated":
    """A parsed line (events.parse_line's dict) as its kind's type; RecordError
    when its fields are not that kind's."""
    cls = _BY_KIND.get(event.get("type"))
    if cls is None:
        raise RecordError(f"unknown event type {event.get('type')!r}")
    fields = event.get("fields")
    if not isinstance(fields, dict):
        raise RecordError("fields must be an object")
    if fields == {"truncated": True}:
        return Truncated(cls.KIND, event.get("conn"))
    return cls.from_fields(fields, event.get("conn"))

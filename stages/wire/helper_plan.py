"""The helper's plan: what vpnw sends the helper it forked first, once the
policy is loaded (docs/architecture.md, "Start-up budget"). The helper does
what needs no policy (its imports, the seccomp filter) while vpnw loads it,
then reads this and does the rest.

On the wire: a 4-byte big-endian length, then `marshal` of plain values
(str, int, bool, None, tuples, one dict of str): a built-in module (the
helper imports nothing for it), no classes made, and the bytes are vpnw's
own (the program does not exist yet). vpnw closes the pipe after the plan;
a pipe that ends first (vpnw refused the run, or died) is no plan, and the
helper then exits having run nothing.
"""
from __future__ import annotations

import marshal
import os

from stages.startup.records import NamedTuple  # typing's, without importing typing

VERSION = 1
_HEADER = 4


class PlanError(Exception):
    """The bytes on the pipe are not a whole plan of this version."""


class Files(NamedTuple):
    """The [files] limits as init enforces them (the fields of
    stages/config/file_limits.py's MountPlan)."""
    hide: tuple = ()
    limit_writes: bool = False
    writable: tuple = ()
    landlock_abi: int = 0


class ProtectedPlan(NamedTuple):
    """What init binds read-only and hides (stages/config/protected.py's HelperProtection)."""
    read_only: tuple = ()
    hide: tuple = ()


class HeldPlan(NamedTuple):
    """The held layer as init mounts it (stages/helper/held_layer.py): the
    run's held directory, the work set (bound back real), the directory of
    every run's held layers (hidden)."""
    dir: str = ""
    work: tuple = ()
    hide: str = ""
    anchors: tuple = ()              # the invoker's homes: each an overlay of its own


class Plan(NamedTuple):
    env: dict | None = None          # the program's environment (None: the helper's own)
    files: Files | None = None
    protected: ProtectedPlan | None = None
    capture: bool = False
    local_ports: tuple = ()          # the `localhost:PORT` rules' ports
    unix_allow: tuple = ()           # (entry as written, path) of [unix] allow
    held: HeldPlan | None = None         # the held layer (None: none)
    secret_ports: tuple = ()         # the secret doors' ports (docs/secrets.md)


def _pairs(items) -> tuple:
    return tuple((str(a), str(b)) for a, b in items)


def encode(plan: Plan) -> bytes:
    files = plan.files
    if files is not None:
        files = (_pairs(files.hide), bool(files.limit_writes), _pairs(files.writable),
                 int(files.landlock_abi))
    protected = plan.protected
    if protected is not None:
        protected = (tuple(str(p) for p in protected.read_only), _pairs(protected.hide))
    env = None if plan.env is None else {str(k): str(v) for k, v in plan.env.items()}
    held = plan.held
    if held is not None:
        held = (str(held.dir), tuple(str(p) for p in held.work), str(held.hide),
                tuple(str(p) for p in held.anchors))
    body = marshal.dumps((VERSION, env, files, protected, bool(plan.capture),
                          tuple(int(p) for p in plan.local_ports), _pairs(plan.unix_allow), held,
                          tuple(int(p) for p in plan.secret_ports)))
    return len(body).to_bytes(_HEADER, "big") + body


def decode(data: bytes) -> Plan:
    if len(data) < _HEADER or int.from_bytes(data[:_HEADER], "big") != len(data) - _HEADER:
        raise PlanError("the plan is cut short")
    try:
        version, env, files, protected, capture, local_ports, unix_allow, held, secret_ports = \
            marshal.loads(data[_HEADER:])
    except (EOFError, ValueError, TypeError) as exc:
        raise PlanError(f"the plan cannot be read: {exc}") from None
    if version != VERSION:
        raise PlanError(f"plan version {version!r}, not {VERSION}")
    return Plan(env=env, files=None if files is None else Files(*files),
                protected=None if protected is None else ProtectedPlan(*protected),
                capture=capture, local_ports=local_ports, unix_allow=unix_allow,
                held=None if held is None else HeldPlan(*held),
                secret_ports=secret_ports)


def send(fd: int, plan: Plan) -> None:
    """Write the whole plan (blocking; the helper reads it once its own
    start is done). BrokenPipeError: the helper is gone (its status says why)."""
    view = memoryview(encode(plan))
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue


def receive(fd: int) -> Plan | None:
    """The plan, read to the pipe's end; None when vpnw sent none (it
    refused the run or died) or only part of one."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        except OSError:
            return None
        if not chunk:
            break
        chunks.append(chunk)
    try:
        return decode(b"".join(chunks))
    except PlanError:
        return None

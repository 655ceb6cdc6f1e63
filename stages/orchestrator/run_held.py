"""The held layer's part in a run (stages/orchestrator/held.py): prepared at
the start, with what it changes in the helper's plan and the protection;
after the program, what it held: held.json, the record's files.held and one
line, and the empty layers removed."""
from __future__ import annotations

import os
import sys

import stages
from stages.config.lookups import invoker_homes
from stages.config.work_set import held_line
from stages.orchestrator import held
from stages.orchestrator.run_request import RunRequest
from stages.record.run_file import vpnw_state_dir
from stages.startup.trace import mark


def held_layer(request: RunRequest, run_id: str, say):
    """The run's work set and held layer, said at the start when the start
    directory is left out of the work set or the layer cannot be had; None
    when a [files] table keeps its read-only meaning."""
    home, other_homes = invoker_homes(request.env)
    layer = held.prepare(run_id, vpnw_state_dir(), os.getcwd(), (home, *other_homes),
                         request.plan.files)
    if layer is None:
        return None
    for line in layer.work.left_out:
        say(line)
    if layer.read_only_why:
        say(f"writes outside the work set fail read-only (EROFS), not held: {layer.read_only_why}; "
            f"`vpnw doctor` says more")
    return layer


def with_the_layer(layer, files_plan, protected):
    """(the helper's [files] plan, the protection) once the layer is decided."""
    if layer.dir is None and (files_plan is None or not files_plan.limit_writes):
        files_plan = held.read_only_plan(layer, files_plan)     # the fallback: fail closed
    return files_plan, held.outside_work_set(protected, layer)


def start_record(layer) -> dict:
    """run.start's fields for the layer; none without one."""
    return held.start_record(layer) if layer is not None else {}


def what_was_held(request: RunRequest, layer, run_id: str, emitter, say) -> bool:
    """After the program: held.json, the record's files.held and one line.
    True when nothing was held (its directory is then removed, later)."""
    home, other_homes = invoker_homes(request.env)
    homes = tuple(dict.fromkeys(os.path.realpath(h) for h in (home, *other_homes)))
    path_dirs = tuple(os.path.realpath(d) for d in request.env.get("PATH", "").split(":") if d.startswith("/"))
    vpnw_paths = (vpnw_state_dir(), sys.prefix, os.path.dirname(stages.__file__))
    mark("vpnw", "held: walk begun")
    try:
        found = held.collect(layer, run_id, homes, path_dirs, vpnw_paths)
        mark("vpnw", "held: walked")
    except OSError as exc:
        say(f"cannot list what the run held in {layer.dir}: {exc}")
        return False
    if found.entries:
        from stages.record import event_types as ev    # loads orjson: after the helper's plan (run.py)
        emitter.emit(ev.FilesHeld(**held.record_fields(found)))
        say(held_line(found.entries, run_id, homes, found.truncated))
        # HeldPlan layers are kept for a bounded time and size (docs/changes.md):
        # only a run that added one pays for the look.
        from stages.record.held import held_root, prune
        try:
            prune(held_root(), spare={run_id})
        except OSError:
            pass
    refused = held.not_held(layer)
    if refused:
        shown = ", ".join(f"{path} ({why})" for path, why in refused[:3])
        say(f"{len(refused)} director{'y' if len(refused) == 1 else 'ies'} outside the work set "
            f"were read-only, not held (an overlay could not be mounted there): {shown}"
            f"{' and more' if len(refused) > 3 else ''}")
    return found.empty


def remove_empty(layer) -> None:
    held.remove_empty(layer)
    mark("vpnw", "held: empty layers removed")

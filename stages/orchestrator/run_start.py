"""What a run starts with, worked out from its request before any stage but
the helper is forked: the program's environment, the helper's plan
(stages/wire/helper_plan.py) and the record's run.start event."""
from __future__ import annotations

import json
import os
import sys

from stages import __version__
from stages.config.client_env import apply as client_env, own_ssh_command_warning
from stages.config.policy import (
    Policy, deny_private_scope, deny_private_shadows, localhost_ports, unix_sockets_named,
)
from stages.orchestrator.run_request import RunRequest
from stages.wire.helper_plan import HeldPlan, Plan

# run.start's room for "unix_allow" (the line must stay below record.MAX_LINE;
# what does not fit is counted in unix_allow_unlisted).
UNIX_ALLOW_BUDGET = 400


def program_env(request: RunRequest, run_id: str) -> tuple[dict, list[str]]:
    """The program's environment (without the config's secret variables,
    with the secret doors' placeholders) and the client settings kept as the
    user set them (names only: the record never holds values)."""
    drop = set(request.plan.config_files.secret_vars)
    env, kept = client_env({k: v for k, v in request.env.items() if k not in drop},
                           python=sys.executable, run_id=run_id)
    if request.plan.secrets is not None:
        # Loaded already when the policy has secrets (run_command's resolve).
        from stages.config.secrets import program_env as with_secret_doors
        env = with_secret_doors(env, request.plan.secrets)
    return env, kept


def file_limits(files) -> tuple[dict | None, dict]:
    """(what the helper enforces, run.start's "files") for a policy's [files]
    table. Landlock's ABI is asked here, once: what the record says is the
    layer set the program then gets (a layer that fails is exit 122)."""
    if files is None:
        return None, {}
    abi = 0
    if files.limits_writes:
        # Only a policy that limits writes asks the kernel.
        from stages.helper.landlock import abi_version
        abi = abi_version()
    return files.to_helper(abi), {"files": files.to_record(abi)}


def helper_plan(request: RunRequest, files_plan, env: dict, protected, layer, say) -> Plan:
    """What the helper forked first needs of the policy (stages/wire/helper_plan.py)."""
    held = HeldPlan(layer.dir, layer.work.paths, layer.hide, layer.homes) \
        if layer is not None and layer.dir else None
    policy, secrets = request.plan.policy, request.plan.secrets
    return Plan(env=env, files=files_plan, protected=protected.to_helper(),
                capture=request.plan.capture,
                local_ports=localhost_ports(policy) if policy.allow else (),
                unix_allow=tuple(_unix_sockets_named(policy.unix_allow, request.env, say)),
                held=held, secret_ports=tuple(secrets.ports.values()) if secrets else ())


def _unix_sockets_named(entries, env: dict, say) -> list[tuple[str, str]]:
    """The policy's [unix] allow, its $VARIABLES read from vpnw's own
    environment once, now; an entry that names nothing is said, not fatal."""
    if not entries:
        return []
    named, warnings = unix_sockets_named(entries, env)
    for warning in warnings:
        say(warning)
    return named


def unix_allow_record(entries, env: dict) -> dict:
    """run.start's "unix_allow": each [unix] allow entry as written and the
    path it names on this run ($VARIABLES read now, as the helper gets them;
    null when it names nothing usable); absent without entries."""
    if not entries:
        return {}
    paths = dict(unix_sockets_named(entries, env)[0])
    listed, room = [], UNIX_ALLOW_BUDGET
    for entry in entries:
        item = {"entry": entry, "path": paths.get(entry)}
        room -= len(json.dumps(item)) + 1       # ASCII-escaped: never shorter than the record's
        if room < 0:
            break
        listed.append(item)
    unlisted = len(entries) - len(listed)
    return {"unix_allow": listed, **({"unix_allow_unlisted": unlisted} if unlisted else {})}


def keys_given(env: dict, secrets) -> list[str]:
    """The usual API keys' variables the program holds with a real value (not
    a secret door's placeholder): run.start's keys_given, names only, so the
    record says a run had a key (docs/secrets.md) and learn can suggest a door."""
    # The key names' table lives with the secrets (their door is there).
    from stages.config.secrets import KEY_VARIABLES
    placeholders = set(secrets.placeholders.values()) if secrets else set()
    return sorted(v for v in set(KEY_VARIABLES.values()) | {"GITHUB_TOKEN", "CODEX_API_KEY"}
                  if env.get(v) and env[v] not in placeholders)


def warn_own_settings(request: RunRequest, env_kept: list[str], say) -> None:
    """A setting of the user's own that cannot work in the sandbox, said at
    the start of every mode (not with --quiet; capture makes it work)."""
    warning = own_ssh_command_warning(request.env, env_kept)
    if warning and not request.options.quiet and not request.plan.capture:
        say(warning)


def _deny_private(policy: Policy, resolves_at_exit: bool) -> dict:
    """run.start's deny_private_scope and deny_private_shadows (the allow rules
    it refuses), present only when the policy sets deny_private."""
    scope = deny_private_scope(policy, resolves_at_exit)
    return {**({"deny_private_scope": scope} if scope else {}), **deny_private_shadows(policy)}


def emit_run_start(emitter, request: RunRequest, record: str, files_record: dict,
                   env_kept, protected, held_start: dict, keys: list[str]) -> None:
    options, plan = request.options, request.plan
    unix_allow = unix_allow_record(plan.policy.unix_allow, request.env)
    deny_private = _deny_private(plan.policy, plan.path.resolves_at_exit)
    from stages.record import event_types as ev    # loads orjson: after the helper's plan (run.py)
    emitter.emit(ev.RunStart(
        mode=options.mode, program=os.path.basename(options.program[0]),
        policy=plan.policy.name if plan.policy.source else None,
        policy_file=plan.policy.source, via=plan.path.name, config=options.config_file or None,
        dry_run=options.dry_run, allow_unix_sockets=options.allow_unix_sockets,
        version=__version__, record=record, **files_record, env_kept=env_kept, **deny_private,
        capture=True if plan.capture else None, ask=True if plan.ask else None,
        **unix_allow, **held_start,
        secrets=plan.secrets.record() if plan.secrets else None, keys_given=list(keys) or None,
        protected=protected.to_record(budget=(800 if files_record else 2800)
                                      - (UNIX_ALLOW_BUDGET if unix_allow else 0)
                                      - len(repr(deny_private)))))   # its own room

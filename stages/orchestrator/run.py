"""The orchestrator: starts the stages, wires their pipes, waits, decides the exit code.

It is the only process that decides vpnw's exit code (docs/architecture.md, "Exit codes"). Each stage
is forked from this single-threaded process and runs its own `main_from_fds`;
the stages import their heavy modules only after the fork, so they load in
parallel and the orchestrator stays light.
"""
from __future__ import annotations

import gc
import os
import signal
import sys
import time

from stages import __version__
from stages.startup.records import Factory, NamedTuple, Record   # not dataclasses, not typing
from stages.orchestrator import outcome
from stages.wire import status as st
from stages.wire.exits import ExitCode
from stages.startup.trace import mark
from stages.record.run_file import RecordUnwritable, open_run_file, vpnw_state_dir
from stages.orchestrator.helper_first import (  # noqa: F401  (names callers and tests use)
    FORWARDED_SIGNALS, Helper as _Helper, RunRefused, Terminal as _Terminal, abandon,
    become_stdio as _become_stdio, fork_stage as _fork_stage, open_the_log, send_plan,
)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
HURRY_SIGNAL = signal.SIGURG


class RunRequest(Record):
    """One run as the command line asked for it."""
    mode: str                      # run | trace | guard
    argv: list[str]
    policy: object                 # stages.config.policy.Policy
    path: object                   # stages.config.paths.PathSpec
    record: str | None = None      # file, "-" for stdout, None for the state directory
    events_to: str | None = None
    allow_unix_sockets: bool = False
    dry_run: bool = False
    files: object = None           # stages.config.file_limits.FileLimits, when the policy has [files]
    log: str | None = None         # human lines to this file instead of stderr
    quiet: bool = False            # human lines: only denials and the summary
    syslog: str | None = None      # --syslog TARGET
    events_format: str = "jsonl"   # what --events-to and --syslog carry
    config_file: str | None = None # the paths file of this run (read-only to the program)
    ask: bool = False              # guard --ask: the person decides what the policy does not allow
    ask_timeout: float = 60.0      # seconds a question waits before it is a denial
    capture: bool = False          # --capture or the policy's capture = true
    config_files: object = None    # stages.config.paths.ConfigFiles: what the config names
    env: dict = Factory(lambda: dict(os.environ))
    no_clipboard: bool = False     # drop the program's OSC 52 on the user's terminal
    secrets: object = None         # stages.config.secrets.Resolved: the policy's secrets, read


# While the program's terminal is relayed, vpnw's own messages join its output
# at line boundaries (terminal.TerminalRelay.say) instead of cutting into it.
_relay_say = None


def say(message: str) -> None:
    if _relay_say is not None:
        _relay_say(f"vpnw: {message}")
        return
    sys.stderr.write(f"vpnw: {message}\n")
    sys.stderr.flush()


def _unix_sockets_named(request: RunRequest) -> list[tuple[str, str]]:
    """The policy's [unix] allow, its $VARIABLES read from vpnw's own
    environment once, now; an entry that names nothing is said, not fatal."""
    entries = getattr(request.policy, "unix_allow", ())
    if not entries:
        return []
    from stages.config.policy import unix_sockets_named
    named, warnings = unix_sockets_named(entries, request.env)
    for warning in warnings:
        say(warning)
    return named


# run.start's room for "unix_allow" (the line must stay below record.MAX_LINE;
# what does not fit is counted in unix_allow_unlisted).
UNIX_ALLOW_BUDGET = 400


def _unix_allow_record(request: RunRequest) -> dict:
    """run.start's "unix_allow": each [unix] allow entry as written and the
    path it names on this run ($VARIABLES read now, as the helper gets them;
    null when it names nothing usable); absent without entries."""
    entries = getattr(request.policy, "unix_allow", ())
    if not entries:
        return {}
    import json
    from stages.config.policy import unix_sockets_named
    paths = dict(unix_sockets_named(entries, request.env)[0])
    listed, room = [], UNIX_ALLOW_BUDGET
    for entry in entries:
        item = {"entry": entry, "path": paths.get(entry)}
        room -= len(json.dumps(item)) + 1       # ASCII-escaped: never shorter than the record's
        if room < 0:
            break
        listed.append(item)
    unlisted = len(entries) - len(listed)
    return {"unix_allow": listed, **({"unix_allow_unlisted": unlisted} if unlisted else {})}


def _program_env(env: dict, run_id: str) -> tuple[dict, list[str]]:
    """The program's environment and the client settings kept as the user set
    them (names only: the record never holds values)."""
    from stages.config.client_env import apply
    return apply(env, python=sys.executable, run_id=run_id)


def _start_relay(terminal: _Terminal):
    """The relay, waiting for the pty's master: the helper makes the pty in
    the sandbox's own devpts and sends the master over the socket. Until it
    comes (or if it never does: the helper failed first) vpnw's lines still
    flow through the relay."""
    from stages.orchestrator.terminal import TerminalRelay
    ours, helpers = terminal.pty_socket
    helpers.close()
    terminal.pty_socket = None
    global _relay_say
    keys = terminal.on_tty[0]
    terminal.relay = TerminalRelay(0 if keys else terminal.program_out, terminal.program_out, None,
                                   terminal.human_r, master_from=ours, keys=keys,
                                   no_clipboard=terminal.no_clipboard)
    _relay_say = terminal.relay.say
    return terminal.relay


def execute(request: RunRequest, terminal: _Terminal, helper: _Helper) -> int:
    """The run, its terminal planned and its helper forked first
    (helper_first.py); a run that ends before the plan is sent abandons the
    helper (it has made nothing yet)."""
    global _relay_say
    try:
        try:
            open_the_log(terminal, request.log)
        except RunRefused as exc:
            say(str(exc))
            return ExitCode.USAGE
        return _execute(request, terminal, helper)
    finally:
        abandon(helper)
        _relay_say = None
        if terminal.relay is not None:
            terminal.relay.close()
        elif terminal.pty_socket is not None:
            for end in terminal.pty_socket:
                end.close()


def _execute(request: RunRequest, terminal: _Terminal, helper: _Helper) -> int:
    started = time.monotonic()
    path_name = request.path.name
    relay = None
    # The record is opened before anything starts: a run that cannot be
    # recorded is not run at all (docs/security.md, "The record is out of the program's reach").
    try:
        record, record_fd, run_id = open_run_file(request.record or None)
    except RecordUnwritable as exc:
        say(str(exc))
        return ExitCode.INTERNAL
    mark("vpnw", "record opened")
    files_plan, files_record = _file_limits(request.files)
    protection = _protection(request, record)
    layer = _held_layer(request, run_id)
    if layer is not None:
        files_plan, protection = _with_the_layer(layer, files_plan, protection)
    names_before = _identities(_evidence_names(request, record) + _pinned_names(protection))
    program_env, env_kept = _program_env(_without_secrets(request), run_id)
    if request.secrets is not None:
        from stages.config.secrets import program_env as with_secret_doors
        program_env = with_secret_doors(program_env, request.secrets)
    mark("vpnw", "protection and environment computed")

    # The helper was forked first (helper_first.py) and has done what needs
    # no policy meanwhile; now its plan. It reports ready and then waits for
    # go, which comes only once the recorder has written run.start and the
    # broker has checked the path (docs/architecture.md, "Start-up budget").
    send_plan(helper, _helper_plan(request, files_plan, program_env, protection, layer))
    # The record's modules (orjson) load only now, after the helper's plan:
    # the helper never needs them, and the recorder and the broker, forked
    # next, share them.
    from stages.record.events import Emitter
    # Then the recorder: nothing is recorded that it does not see. The broker
    # dials only while the recorder holds room for the lines (record/gate.py).
    from stages.record.gate import RecordGate
    record_gate = RecordGate()
    stage_stdio = (0, 1, terminal.human_fd)
    recorder_pid, events_w, recorded_r = _start_recorder(request, terminal, record, record_fd,
                                                         record_gate, stage_stdio)
    mark("vpnw", "recorder forked")
    emitter = Emitter(events_w, run_id, path=path_name)
    _warn_own_settings(request, env_kept)
    _emit_run_start(emitter, request, record, files_record, env_kept, protection, layer,
                    _keys_given(program_env, request.secrets))
    mark("vpnw", "run.start sent")
    for entry in protection.lifted:
        say(f"allow_write names {entry.path} ({entry.why}): the program may change it, "
            f"and what it writes there runs outside the sandbox later")
    _say_scan_cut(protection)

    stages = _start_broker(request, terminal, helper, run_id, events_w, record_gate, stage_stdio)
    mark("vpnw", "broker forked")
    if terminal.pty:
        relay = _start_relay(terminal)
    asker = _start_asker(request, stages.ask_link, run_id, relay)

    gc.enable()     # every stage is forked: off only while vpnw started (cli.py)
    run = _Run(request, emitter, stages.helper_pid, stages.broker_pid, recorder_pid,
               stages.helper_status_r, stages.broker_status_r, stages.go_w, recorded_r, relay, asker)
    code, error = run.wait()
    mark("vpnw", "stages reaped")
    moved = _after_the_program(protection, names_before, run_id)
    if moved:
        say(moved)
        code, error = ExitCode.INTERNAL, error or moved
    held_nothing = layer is not None and _what_was_held(request, layer, run_id, emitter)
    _say_new_repositories(request, record, protection)
    if relay is not None:
        relay.finish_program()

    totals = run.totals or st.Totals()
    emitter.emit("run.end", exit_code=int(code), connections=totals.connections,
                 denied=totals.denied, would_deny=totals.would_deny, failed=totals.failed,
                 ms=round((time.monotonic() - started) * 1000, 3),
                 **({"error": error} if error else {}))
    # Marked before the close: the recorder's EOF (and so its "signed" mark)
    # can come before vpnw runs again after it.
    mark("vpnw", "run.end sent")
    os.close(events_w)
    run.reap()
    if held_nothing:
        from stages.orchestrator.held import remove_empty
        remove_empty(layer)
        mark("vpnw", "held: empty layers removed")
    return _wait_for_the_recorder(recorder_pid, relay, record, int(code))


class _SandboxStages(NamedTuple):
    broker_pid: int
    helper_pid: int
    broker_status_r: int
    helper_status_r: int
    go_w: int
    ask_link: object


def _helper_plan(request: RunRequest, files_plan, program_env, protection, layer=None):
    """What the helper forked first needs of the policy (stages/wire/helper_plan.py)."""
    from stages.wire.helper_plan import HeldPlan, Plan
    held = HeldPlan(layer.dir, layer.work.paths, layer.hide, layer.homes) \
        if layer is not None and layer.dir else None
    return Plan(env=program_env, files=files_plan, protected=protection.to_helper(),
                capture=request.capture, local_ports=_localhost_ports(request.policy),
                unix_allow=tuple(_unix_sockets_named(request)), held=held,
                secret_ports=tuple(request.secrets.ports.values()) if request.secrets else ())


def _held_layer(request: RunRequest, run_id: str):
    """The run's work set and held layer (stages/orchestrator/held.py), said
    at the start when the start directory is left out of the work set or the
    layer cannot be had; None when a [files] table keeps its read-only meaning."""
    from stages.config.lookups import invoker_homes
    from stages.orchestrator import held
    home, other_homes = invoker_homes(request.env)
    layer = held.prepare(run_id, vpnw_state_dir(), os.getcwd(), (home, *other_homes), request.files)
    if layer is None:
        return None
    for line in layer.work.left_out:
        say(line)
    if layer.read_only_why:
        say(f"writes outside the work set fail read-only (EROFS), not held: {layer.read_only_why}; "
            f"`vpnw doctor` says more")
    return layer


def _with_the_layer(layer, files_plan, protection):
    """(the helper's [files] plan, the protection) once the layer is decided."""
    from stages.orchestrator import held
    if layer.dir is None and (files_plan is None or not files_plan.limit_writes):
        files_plan = held.read_only_plan(layer, files_plan)     # the fallback: fail closed
    return files_plan, held.outside_work_set(protection, layer)


def _what_was_held(request: RunRequest, layer, run_id: str, emitter) -> bool:
    """After the program: held.json, the record's files.held and one line.
    True when nothing was held (its directory is then removed, later)."""
    from stages.config.lookups import invoker_homes
    from stages.config.work_set import held_line
    from stages.orchestrator import held
    import stages
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
        emitter.emit("files.held", **held.record_fields(found))
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


def _start_broker(request: RunRequest, terminal: _Terminal, helper: _Helper, run_id: str,
                  events_w: int, record_gate, stage_stdio) -> _SandboxStages:
    """The broker, once run.start is on the event pipe (its path.check comes
    after it), on the handoff link's far end; the pipes status comes on."""
    broker_end = helper.broker_end      # an fd
    broker_status_r, broker_status_w = os.pipe()
    ask_link = _ask_link(request)

    def broker_body():
        mark("broker", "forked")
        from stages.broker.main import main_from_fds
        return main_from_fds(broker_end, events_w, broker_status_w, run_id=run_id,
                             policy=request.policy, path=request.path,
                             dry_run=request.dry_run, record_gate=record_gate,
                             ask_fd=ask_link[1].fileno() if ask_link else None,
                             capture=request.capture, secrets=request.secrets)

    broker_pid = _fork_stage([broker_end, events_w, broker_status_w,
                              *([ask_link[1].fileno()] if ask_link else [])], broker_body,
                             stdio=stage_stdio)
    for fd in (broker_status_w, broker_end, *terminal.own_fds):
        os.close(fd)
    return _SandboxStages(broker_pid, helper.pid, broker_status_r, helper.status_r, helper.go_w,
                          ask_link)


def _start_recorder(request: RunRequest, terminal: _Terminal, record: str, record_fd: int,
                    record_gate, stage_stdio) -> tuple[int, int, int]:
    """The recorder, forked first: nothing happens that it does not see.
    -> (its pid, the event pipe's write end, the pipe that says run.start is written)."""
    events_r, events_w = os.pipe()
    recorded_r, recorded_w = os.pipe()
    human = "denials" if request.quiet else {"trace": "trace"}.get(request.mode, "run")

    def recorder_body():
        mark("recorder", "forked")
        from stages.recorder.main import main_from_fds
        return main_from_fds(events_r, record=record, record_fd=record_fd, ready_fd=recorded_w,
                             human=human, tee_command=request.events_to, color=terminal.color,
                             syslog_target=request.syslog, events_format=request.events_format,
                             record_gate=record_gate, sign=True,
                             errors_said=not request.log)   # say() writes on the same stream

    recorder_pid = _fork_stage([events_r, record_fd, recorded_w], recorder_body, stdio=stage_stdio)
    for fd in (events_r, record_fd, recorded_w):
        os.close(fd)
    return recorder_pid, events_w, recorded_r


def _keys_given(program_env: dict, secrets) -> list[str]:
    """The usual API keys' variables the program holds with a real value (not
    a secret door's placeholder): run.start's keys_given, names only, so the
    record says a run had a key (docs/secrets.md) and learn can suggest a door."""
    from stages.config.secrets import KEY_VARIABLES
    placeholders = set(secrets.placeholders.values()) if secrets else set()
    return sorted(v for v in set(KEY_VARIABLES.values()) | {"GITHUB_TOKEN", "CODEX_API_KEY"}
                  if program_env.get(v) and program_env[v] not in placeholders)


def _emit_run_start(emitter, request: RunRequest, record: str, files_record: dict,
                    env_kept, protection, layer=None, keys_given=()) -> None:
    policy_name = getattr(request.policy, "name", None)
    unix_allow = _unix_allow_record(request)
    deny_private = _deny_private_scope(request)
    emitter.emit("run.start", mode=request.mode, program=os.path.basename(request.argv[0]),
                 policy=policy_name if getattr(request.policy, "source", None) else None,
                 policy_file=getattr(request.policy, "source", None), via=request.path.name,
                 **({"config": request.config_file} if request.config_file else {}),
                 dry_run=request.dry_run, allow_unix_sockets=request.allow_unix_sockets,
                 version=__version__, record=record, **files_record,
                 env_kept=env_kept, **deny_private,
                 **({"capture": True} if request.capture else {}),
                 **({"ask": True} if request.ask else {}),
                 **unix_allow,
                 **(_held_start(layer) if layer is not None else {}),
                 **({"secrets": request.secrets.record()} if request.secrets else {}),
                 **({"keys_given": list(keys_given)} if keys_given else {}),
                 protected=protection.to_record(budget=(800 if files_record else 2800)
                                                - (UNIX_ALLOW_BUDGET if unix_allow else 0)
                                                - len(repr(deny_private))))   # its own room


def _held_start(layer) -> dict:
    from stages.orchestrator import held
    return held.start_record(layer)


def _wait_for_the_recorder(recorder_pid: int, relay, record: str, code: int) -> int:
    """vpnw's last lines through the terminal, then the recorder's end: a
    recorder that failed makes the run vpnw's failure (125)."""
    if relay is not None:
        recorder_fd = os.pidfd_open(recorder_pid)
        try:
            relay.finish_human(recorder_fd)
        finally:
            os.close(recorder_fd)
    _, status = os.waitpid(recorder_pid, 0)
    mark("vpnw", "recorder reaped")
    if os.waitstatus_to_exitcode(status) != 0 and code != ExitCode.INTERNAL:
        say(f"the recorder failed; the record {record} may be incomplete")
        return ExitCode.INTERNAL
    return code


def _ask_link(request: RunRequest):
    """guard --ask: the broker's link to the one place that asks (asker.py)."""
    if not request.ask:
        return None
    import socket
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def _start_asker(request: RunRequest, ask_link, run_id: str, relay):
    if ask_link is None:
        return None
    ask_link[1].close()
    from stages.orchestrator.asker import Asker
    return Asker(run_id=run_id, broker_end=ask_link[0], policy=request.policy, relay=relay,
                 say=say, timeout=request.ask_timeout, state_dir=vpnw_state_dir(),
                 program=os.path.basename(request.argv[0]))


def _warn_own_settings(request: RunRequest, env_kept: list[str]) -> None:
    """A setting of the user's own that cannot work in the sandbox, said at
    the start of every mode (not with --quiet; capture makes it work)."""
    from stages.config.client_env import own_ssh_command_warning
    warning = own_ssh_command_warning(request.env, env_kept)
    if warning and not request.quiet and not request.capture:
        say(warning)


def _protection(request: RunRequest, record: str):
    """What the program may not change (stages/config/protected.py): vpnw's
    installation and evidence (its state directory, made if missing so the
    program cannot make it and plant runs there; the record, the policy, the
    config, the --log), what the config names, and the files that run code
    outside the sandbox later, among them the work set's repositories'."""
    from stages.config import protected as pr
    from stages.config.lookups import locate
    return pr.protect(_protection_inputs(request, record), locate, pr.read_small, pr.list_small_dir)


def _protection_inputs(request: RunRequest, record: str):
    from stages.config import protected as pr
    from stages.config.lookups import invoker_homes
    state = vpnw_state_dir()
    keys = os.path.join(state, "keys")
    for made in (os.path.join(state, "runs"), keys):
        try:
            # keys/ too: there is always something to mount the key's empty directory on.
            os.makedirs(made, mode=0o700, exist_ok=True)
        except OSError:
            pass
    cwd = os.getcwd()
    home, other_homes = invoker_homes(request.env)
    named = request.config_files
    files = request.files
    allow_write = tuple(l.path for l in files.allow_write) if files and files.allow_write else ()
    evidence = [state, record, getattr(request.policy, "source", None), request.config_file,
                request.log]
    import stages
    inputs = pr.Inputs(
        homes=(home, *other_homes), cwd=cwd,
        install=pr.installation(sys.executable, [p for p in sys.path if p != cwd], sys.prefix,
                                sys.base_prefix, os.path.dirname(stages.__file__),
                                sys.argv[0] if os.path.isabs(sys.argv[0]) else None),
        evidence=tuple(p for p in dict.fromkeys(evidence) if p and p != "-"),
        named=tuple(named.named) if named else (),
        secrets=(*(named.secret_files if named else ()), *_secret_files(request, home)),
        signing_key=(keys,),
        allow_write=allow_write,
        writable_trees=tuple(l.path for l in files.writable() if l.kind == "dir") if files else ())
    return inputs


def _secret_files(request: RunRequest, home: str) -> tuple[str, ...]:
    """The files a secret stands for (the agent's own credential files, a
    file: source): hidden, as the config's secret files are."""
    if request.secrets is None:
        return ()
    from stages.config.secrets import expand_home
    return tuple(expand_home(p, home) for s in request.secrets.secrets for p in s.hide)


def _evidence_names(request: RunRequest, record: str) -> list[str]:
    """The names the next run and `vpnw runs`/`show` look evidence up by.
    For the policy and the config, their directories: the files themselves
    are bound read-only (neither replaced nor removed inside), so only a
    directory above can move them, and that gives the directory another
    inode at its name; `guard --ask` writes the policy file in place (its
    inode stays)."""
    state = vpnw_state_dir()
    names = [state, os.path.join(state, "runs")]
    for named in (getattr(request.policy, "source", None), request.config_file):
        if named and named != "-":
            names.append(os.path.dirname(os.path.abspath(named)))
    if record != "-":
        names += [record, os.path.dirname(os.path.abspath(record))]
    return list(dict.fromkeys(names))


def _identities(names: list[str]) -> dict:
    out = {}
    for name in names:
        try:
            st_ = os.stat(name)
            out[name] = (st_.st_dev, st_.st_ino)
        except OSError:
            out[name] = None
    return out


def _after_the_program(protection, names_before: dict, run_id: str) -> str | None:
    """Once the program and all its processes are gone (its PID namespace
    ended with it): (1) each evidence name still names the file or directory
    it named at the start: a directory above renamed from inside would let
    the next run load another policy, or `vpnw runs` list forged runs;
    (2) a protected file that did not exist at the start (nothing to bind
    read-only) and exists now is moved aside, never deleted, so the shell or
    git does not run it. A message when either happened, else None."""
    problems = []
    now = _identities(list(names_before))
    replaced = {}
    for name, before in names_before.items():
        if before is not None and now[name] != before:
            replaced[name] = (before, now[name])
            problems.append(f"{name} is no longer the file or directory it was when the run "
                            f"started (it, or a directory above it, was moved or replaced during "
                            f"the run)")
    _remember_replaced(replaced, run_id)
    for entry in protection.absent:
        if not os.path.lexists(entry.path):
            continue
        if _agents_own_first_settings(entry):
            continue
        aside = f"{entry.path}.vpnw-planted-{run_id}"
        try:
            os.rename(entry.path, aside)
            problems.append(f"{entry.path} ({entry.why}) appeared during the run; "
                            f"vpnw moved it to {aside}: look at it before you use it")
        except OSError as exc:
            problems.append(f"{entry.path} ({entry.why}) appeared during the run and could "
                            f"not be moved aside ({exc.strerror}): look at it before you "
                            f"start a shell or git")
    if not problems:
        return None
    return "WARNING: " + "; ".join(problems)


def _agents_own_first_settings(entry) -> bool:
    """An agent's settings file made during the run that names no command:
    the agent's own first settings (Codex writes ~/.codex/config.toml on its
    first start), left where it is, and read-only from the next run on. One
    that names a command is moved aside like any planted start-up file."""
    from stages.config import protected as pr
    if entry.why != pr.AGENT_SETTINGS:
        return False
    read_text = lambda path: pr.read_small(path, limit=1 << 20)   # noqa: E731
    return not pr.new_agent_settings_run_commands(entry.path, read_text)


def _pinned_names(protection) -> list[str]:
    """The protected paths the helper binds read-only and the directories it
    pins above them (stages/helper/pins.py), whose inodes are compared after
    the run. Not the name look-ups: the host replaces /etc/resolv.conf itself."""
    from stages.config.protected import NAME_LOOKUP
    from stages.helper.pins import ancestors_to_pin
    # work_set's mountinfo reader, not kernel.mounts': that one brings the
    # privileges module (and _ctypes) into the orchestrator before the
    # recorder is forked (tests/test_recorder_start_cost.py).
    from stages.config.work_set import mount_table
    # Not the evidence files either: `guard --ask` replaces the policy from
    # outside during the run (their folders are compared: _evidence_names).
    paths = [p.path for p in protection.read_only
             if p.path not in NAME_LOOKUP and p.why != "vpnw's evidence"]
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            points = [m.point for m in mount_table(f.read())]
    except OSError:
        points = ["/"]
    return paths + ancestors_to_pin(paths, points)


def _say_scan_cut(protection) -> None:
    from stages.config.protected import SCAN_BUDGET, SCAN_DEPTH
    for tree in protection.scan_cut:
        say(f"{tree} has more than {SCAN_BUDGET} directories in its first {SCAN_DEPTH} levels: "
            f"vpnw did not look for every repository there, and the git hooks and config of "
            f"those it did not find are not pinned read-only")


def _remember_replaced(replaced: dict, run_id: str) -> None:
    """What a run found replaced is kept in vpnw's state, so that the next run
    refuses a policy or config it would now load from there
    (stages/orchestrator/replaced.py)."""
    if not replaced:
        return
    from stages.orchestrator import replaced as rp
    try:
        rp.remember(vpnw_state_dir(), replaced, run_id)
    except OSError as exc:
        say(f"WARNING: cannot note in {vpnw_state_dir()} what was replaced ({exc.strerror}): "
            f"the next run cannot warn of it")


def _say_new_repositories(request: RunRequest, record: str, protection) -> None:
    """A repository the program made in the work set with hooks or config
    that run commands: named in the summary (git runs them when the person
    next works there; nothing stopped the program making it)."""
    from stages.config import protected as pr
    from stages.config.lookups import locate
    inputs = _protection_inputs(request, record)
    repositories, _cut = pr.work_set_repositories(inputs, locate, pr.read_small, pr.list_small_dir)
    before = set(protection.repositories)
    for repo in repositories:
        if repo.git_dir in before:
            continue
        active = pr.active_start_up(repo.git_dir, pr.list_small_dir, pr.read_small)
        if active:
            from stages.record.text import printable    # the names are the program's
            say(f"the program made the repository {printable(repo.work_tree)} "
                f"({printable(repo.git_dir)}) with "
                f"{printable(', '.join(active[:6]))}{' ...' if len(active) > 6 else ''}: git runs "
                f"them when you next work there; look at them first")


def _without_secrets(request: RunRequest) -> dict:
    """The caller's environment without the variables the config names for a
    secret (password_env, private_key_env), of every path in it."""
    named = request.config_files
    drop = set(named.secret_vars) if named else set()
    return {k: v for k, v in request.env.items() if k not in drop}


def _localhost_ports(policy) -> tuple:
    """The `localhost:PORT` rules' ports: a door each in the sandbox."""
    from stages.config.policy import localhost_ports
    return localhost_ports(policy) if getattr(policy, "allow", None) else ()


def _deny_private_scope(request) -> dict:
    """run.start's deny_private_scope and deny_private_shadows (the allow rules
    it refuses), present only when the policy sets deny_private."""
    from stages.config.policy import Policy, deny_private_scope, deny_private_shadows
    if not isinstance(request.policy, Policy):
        return {}
    scope = deny_private_scope(request.policy, bool(getattr(request.path, "resolves_at_exit", False)))
    return {**({"deny_private_scope": scope} if scope else {}), **deny_private_shadows(request.policy)}


def _file_limits(files) -> tuple[dict | None, dict]:
    """(what the helper enforces, run.start's "files") for a policy's [files]
    table. Landlock's ABI is asked here, once: what the record says is the
    layer set the program then gets (a layer that fails is exit 122)."""
    if files is None:
        return None, {}
    abi = 0
    if files.limits_writes:
        from stages.helper.landlock import abi_version
        abi = abi_version()
    return files.to_helper(abi), {"files": files.to_record(abi)}


# Which status message each channel may send in which phase (the discipline of
# OpenSSH's monitor dispatch tables): anything else is refused, the stage is
# stopped and the run ends 125. The helper: sealing -> sealed (Ready) ->
# running (go sent) -> over (its last message); the broker: checking -> checked
# (its path report) -> over (Totals).
ACCEPTED = {
    "helper": {
        st.Ready: {"sealing"},
        st.Stopped: {"running"},                       # only on a terminal
        st.UnixConnect: {"running"},                   # the supervisor's, while the program runs
        st.LoopbackRefused: {"running"},               # the supervisor's too
        st.SandboxFailed: {"sealing", "sealed", "running"},
        st.ExecFailed: {"sealing", "sealed", "running"},
        st.Exited: {"running"},
    },
    "broker": {
        st.PathOk: {"checking"},
        st.PathDown: {"checking"},
        st.Totals: {"checking", "checked"},            # a broker that fails first sends only Totals
    },
}
PHASE_WORDS = {"sealing": "the sandbox was being sealed", "sealed": "the program waited to start",
               "running": "the program ran", "over": "the stage had sent its last message",
               "checking": "the path was being checked", "checked": "the path had been reported"}


class _Run:
    """Waits for the stages and turns what they report into vpnw's exit code."""

    def __init__(self, request, emitter, helper_pid, broker_pid, recorder_pid,
                 helper_status_r, broker_status_r, go_w, recorded_r, relay=None, asker=None):
        self.request = request
        self.relay = relay
        self.asker = asker           # guard --ask (asker.py)
        self.emitter = emitter
        self.pids = {"helper": helper_pid, "broker": broker_pid, "recorder": recorder_pid}
        self.helper = st.StatusReader(helper_status_r, st.HELPER_STATUS)
        self.broker = st.StatusReader(broker_status_r, st.BROKER_STATUS)
        self.go_w = go_w
        self.path_ok = None          # None until the broker has checked the path
        self.path_down = None        # st.PathDown, or a message when the broker said nothing
        self.ready = None            # the helper's seal report (st.Ready)
        self.started = False
        self.program_exit = None     # st.Exited
        self.exec_error = None       # st.ExecFailed
        self.seal_error = None       # message: the sandbox could not be built (122)
        self.helper_over = False     # the helper sent its last message
        self.totals = None           # st.Totals
        self.fatal = None            # a stage died or broke the protocol: message (125)
        self.refused = None          # a stage's message was refused: message (125, first of all)
        self.recorded_r = recorded_r  # one byte once run.start is in the record
        self.recorded = False
        self.pending_signals: list[int] = []
        self.interrupted = None      # a signal that came before the program started
        self.loopback_refused = []   # ports refused inside that the machine listens on

    def _on_signal(self, signum, _frame):
        self.pending_signals.append(signum)

    def _forward_signals(self):
        while self.pending_signals:
            sig = self.pending_signals.pop(0)
            if sig == signal.SIGWINCH:
                self.relay.resize()
                continue
            if sig == signal.SIGCONT:
                self.relay.resumed()
                continue
            if sig in STOP_SIGNALS and (self.request.events_to or self.request.syslog):
                # Told to stop: side outputs (--events-to) get no grace at the
                # end. SIGURG because its default action is to be ignored: a
                # recorder that has not set its handler yet is not killed.
                try:
                    os.kill(self.pids["recorder"], HURRY_SIGNAL)
                except ProcessLookupError:
                    pass
            if self.started and self.program_exit is None:
                try:
                    os.kill(self.pids["helper"], sig)
                except ProcessLookupError:
                    pass
            elif not self.started:
                self.interrupted = self.interrupted or sig
                self.fatal = self.fatal or f"interrupted by signal {sig} before the program started"

    def wait(self) -> tuple[int, str | None]:
        caught = FORWARDED_SIGNALS + ((signal.SIGWINCH, signal.SIGCONT) if self.relay else ())
        old = {sig: signal.signal(sig, self._on_signal) for sig in caught}
        if self.relay is None and self.asker is None:
            from stages.orchestrator import fd_wait as selectors    # no selectors module
        else:
            import selectors    # only now: vpnw's own, after every stage is forked
        sel = selectors.DefaultSelector()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        try:
            if self.relay is not None:
                self.relay.start(sel)
            if self.asker is not None:
                self.asker.start(sel)
            sel.register(self.helper.fd, selectors.EVENT_READ, "helper")
            sel.register(self.broker.fd, selectors.EVENT_READ, "broker")
            sel.register(wake_r, selectors.EVENT_READ, "signal")
            sel.register(self.recorded_r, selectors.EVENT_READ, "recorded")
            recorder_fd = os.pidfd_open(self.pids["recorder"])
            sel.register(recorder_fd, selectors.EVENT_READ, "recorder")
            while True:
                timeout = self.relay.timeout(time.monotonic(), 1.0) if self.relay else 1.0
                if self.asker is not None:
                    timeout = self.asker.timeout(time.monotonic(), timeout)
                for key, events in sel.select(timeout=timeout):
                    if key.data.startswith("pty:"):
                        self.relay.handle(key.data, events)
                    elif key.data.startswith("ask:"):
                        self.asker.handle(key, events)
                    elif key.data == "signal":
                        os.read(wake_r, 512)
                    elif key.data == "recorded":
                        self.recorded = os.read(self.recorded_r, 1) == b"r" or self.recorded
                        mark("vpnw", "run.start recorded")
                        sel.unregister(self.recorded_r)
                    elif key.data == "recorder":
                        sel.unregister(recorder_fd)
                        if self.totals is None:
                            self.fatal = self.fatal or "the recorder stopped; vpnw stops the program rather than run it unrecorded"
                    else:
                        reader = getattr(self, key.data)
                        self._read(key.data, reader)
                        if reader.eof:
                            mark("vpnw", f"{key.data}'s status ended")
                            sel.unregister(reader.fd)
                            self._on_eof(key.data)
                if self.relay is not None:
                    self.relay.tick()
                if self.asker is not None:
                    self.asker.tick()
                self._forward_signals()
                self._advance()
                if self._done():
                    break
        finally:
            if self.asker is not None:
                self.asker.close()
            if self.relay is not None:
                self.relay.detach()
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in old.items():
                signal.signal(sig, handler)
            sel.close()
            os.close(wake_r)
            os.close(wake_w)
            os.close(self.recorded_r)
            os.close(recorder_fd)
        self._stop_the_broker()
        return self._exit_code()

    def _read(self, stage: str, reader: st.StatusReader) -> None:
        """Every message the stage sent, each checked against what may come now."""
        try:
            for message in reader.messages():
                phase = self._phase(stage)
                if phase not in ACCEPTED[stage][type(message)]:
                    raise st.StatusError(f"{type(message).__name__} while {PHASE_WORDS[phase]}")
                mark("vpnw", f"{stage}: {type(message).__name__}")
                problem = self._HANDLERS[type(message)](self, message)
                if problem:
                    raise st.StatusError(problem)
        except st.StatusError as exc:
            # Nothing more from this stage is believed: stop it and the run (fail closed).
            reader.eof = True
            self.refused = self.refused or (f"the {stage} sent a status message vpnw does not "
                                            f"accept ({exc}); vpnw stopped the run")
            self.fatal = self.fatal or self.refused
            try:
                os.kill(self.pids[stage], signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _phase(self, stage: str) -> str:
        if stage == "helper":
            if self.helper_over:
                return "over"
            return "running" if self.started else "sealed" if self.ready is not None else "sealing"
        if self.totals is not None:
            return "over"
        return "checking" if self.path_ok is None else "checked"

    # Each handler runs only in a phase ACCEPTED allows; it records the report.
    def _on_ready(self, message: st.Ready) -> None:
        self.ready = message
        self.emitter.emit("sandbox.ready", namespaces=list(message.namespaces),
                          seccomp=message.seccomp, unix_sockets=message.unix_sockets,
                          unix=message.unix, doors=dict(message.doors),
                          **({"local_doors": list(message.local)} if message.local else {}))

    def _on_unix(self, message: st.UnixConnect) -> str | None:
        if self.ready.unix != "own":
            return "a Unix-socket report from a sandbox without the supervisor"
        self.emitter.emit("unix.allow" if message.allowed else "unix.deny", path=message.path,
                          process=message.process, program=message.program,
                          **({"rule": message.reason} if message.allowed else
                             {"reason": message.reason}))
        return None

    def _on_loopback_refused(self, message: st.LoopbackRefused) -> str | None:
        """Evidence for the closing hint: a port nothing inside listens on,
        kept when the machine (this network namespace) has a listener there
        that a `localhost:PORT` rule would reach."""
        if self.ready.unix != "own":
            return "a loopback report from a sandbox without the supervisor"
        if message.port in self.loopback_refused or len(self.loopback_refused) >= 16:
            return None
        from stages.kernel.inet_diag import DiagError, loopback_listener
        try:
            if loopback_listener(message.port):
                self.loopback_refused.append(message.port)
        except (OSError, DiagError):
            pass                     # no evidence, no hint
        return None

    def _on_stopped(self, message: st.Stopped) -> str | None:
        if self.relay is None:
            return "a stop report without a terminal"
        self.relay.program_stopped(message.signal)
        return None

    def _on_sandbox_failed(self, message: st.SandboxFailed) -> None:
        self.helper_over = True
        if message.code == ExitCode.NO_SANDBOX:
            self.seal_error = message.error
        else:   # the helper itself failed: vpnw's fault, not the machine's
            self.fatal = self.fatal or message.error

    def _on_exec_failed(self, message: st.ExecFailed) -> None:
        self.helper_over = True
        self.exec_error = message

    def _on_exited(self, message: st.Exited) -> None:
        self.helper_over = True
        self.program_exit = message
        self.emitter.emit("program.exit", code=message.code, signal=message.signal,
                          **({"no_route": message.no_route} if message.no_route else {}),
                          **({"loopback_refused": self.loopback_refused} if self.loopback_refused else {}))

    def _on_path_report(self, message: st.PathOk | st.PathDown) -> None:
        self.path_ok = isinstance(message, st.PathOk)
        if not self.path_ok:
            self.path_down = message

    def _on_totals(self, message: st.Totals) -> None:
        self.totals = message

    _HANDLERS = {st.Ready: _on_ready, st.Stopped: _on_stopped, st.UnixConnect: _on_unix,
                 st.LoopbackRefused: _on_loopback_refused,
                 st.SandboxFailed: _on_sandbox_failed,
                 st.ExecFailed: _on_exec_failed, st.Exited: _on_exited,
                 st.PathOk: _on_path_report, st.PathDown: _on_path_report, st.Totals: _on_totals}

    def _on_eof(self, stage):
        if stage == "helper" and not self.helper_over and not self.fatal:
            if not self.started and self.ready is None:
                self.seal_error = ("the sandbox helper stopped before the seal was ready; the program was not run "
                                   "(run `vpnw doctor` to see what this machine supports)")
            elif self.started:
                self.fatal = "the helper died during the run; the program is gone with it"
        if stage == "broker" and self.totals is None:
            self.fatal = self.fatal or "the broker stopped during the run; its connections failed"
            if self.path_ok is None:
                self.path_ok = False
                self.path_down = "the broker stopped before it checked the path"

    def _advance(self):
        """Start the program once the path is up and the seal holds; stop it on a fatal error."""
        if self.relay is not None and self.relay.master_refused and not self.fatal:
            self.fatal = (f"the sandbox did not hand over the program's terminal "
                          f"({self.relay.master_refused}); the program was not run")
        if not self.started and self.go_w is not None:
            if self.path_ok is False or self.seal_error or self.fatal:
                os.close(self.go_w)  # EOF: the helper gives up without running anything
                self.go_w = None
            elif self.path_ok and self.ready is not None and self.recorded and \
                    (self.relay is None or not self.relay.awaiting_master()):
                mark("vpnw", "go")
                os.write(self.go_w, st.GO)
                os.close(self.go_w)
                self.go_w = None
                self.started = True
                if self.relay is not None:
                    self.relay.program_started()
        if self.fatal and self.started and self.program_exit is None:
            try:
                os.kill(self.pids["helper"], signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _done(self) -> bool:
        helper_over = self.helper.eof
        broker_over = self.broker.eof
        if not self.started:
            # Interrupted: do not wait for a path check to finish; _reap stops the broker.
            return helper_over and (broker_over or self.path_ok is not None or bool(self.interrupted))
        # The helper's last message comes once init and the supervisor are
        # reaped (the sandbox's processes are all gone), the broker's Totals
        # last of all: neither needs their process's exit to be waited for
        # first (reap() comes after run.end).
        return (helper_over or self.helper_over) and (broker_over or self.totals is not None)

    def _stop_the_broker(self):
        if not self.broker.eof and self.totals is None:
            try:
                os.kill(self.pids["broker"], signal.SIGTERM)
            except ProcessLookupError:
                pass

    def reap(self):
        """The helper's and the broker's exit, once they have said their last."""
        for name in ("helper", "broker"):
            os.waitpid(self.pids[name], 0)

    def _exit_code(self) -> tuple[int, str | None]:
        code, message = outcome.exit_code(outcome.Reports(
            path_name=self.request.path.name, started=self.started, path_ok=self.path_ok,
            path_down=self.path_down, seal_error=self.seal_error, fatal=self.fatal,
            refused=self.refused, interrupted=self.interrupted, exec_error=self.exec_error,
            program_exit=self.program_exit, totals=self.totals))
        if message is not None:
            say(message)
        return code, message

"""run, trace and guard once their command line is parsed (by click in cli.py,
or by options.quick_parse): the checks of the environment, the options, the
policy and the paths, then the run (run.py). No click here: a run whose
command line parses cleanly never imports it. Every problem is a
UsageProblem (121, "vpnw: MESSAGE"), raised before anything starts."""
from __future__ import annotations

import os
import sys

from stages.orchestrator import helper_first
from stages.orchestrator.own_lines import OwnLines
from stages.orchestrator.run_request import RunOptions, RunPlan, RunRequest
from stages.wire.exits import ExitCode
from stages.startup.trace import mark

class UsageProblem(Exception):
    """A bad command line, environment, policy or config: 121, said as `vpnw: MESSAGE`."""
    exit_code = ExitCode.USAGE

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def format_message(self):
        return self.message

    def show(self, file=None):
        # click's echo, as when click parsed: the same bytes (it strips
        # escape sequences off a stream that is not a terminal). Only here,
        # on the way out: a run that starts never imports click.
        import click
        click.echo(f"vpnw: {self.message}", err=True)


def check_environment() -> None:
    """The variables vpnw reads, checked like a bad option: before anything starts."""
    # Its checks load when a command runs, not with this module.
    from stages.config.environment import check
    problem = check(dict(os.environ))
    if problem:
        raise UsageProblem(problem)


def _load_policy(policy_file):
    # The loaders' modules load after the helper's fork; this module loads
    # before it, with every command (tests/test_startup_imports.py).
    from stages.config.policy import Policy, PolicyError, load_policy
    if not policy_file:
        return Policy.allow_all()
    preset = None
    if policy_file.startswith("@"):
        # A preset shipped with vpnw (stages/config/presets.py).
        from stages.config import presets
        preset = policy_file
        try:
            policy_file = presets.path(policy_file[1:])
        except presets.UnknownPreset as exc:
            raise UsageProblem(f"--policy {policy_file}: {exc}") from None
    _refuse_replaced(policy_file, "--policy")
    try:
        policy = load_policy(policy_file)
    except PolicyError as exc:
        raise UsageProblem(str(exc)) from None
    if preset is not None:
        # Reasons, the record and the hints name the preset as the user typed
        # it ("@claude-code line 12"), never its file deep in vpnw's install.
        policy = policy.replace(source=preset)
    return policy


def _refuse_replaced(path, what: str) -> None:
    """A policy or config in a folder a run found replaced, still as the run
    left it, is not loaded (stages/orchestrator/replaced.py)."""
    from stages.orchestrator.replaced import refusal      # after the helper's fork, as above
    from stages.record.run_file import vpnw_state_dir     # as above
    problem = refusal(vpnw_state_dir(), path, what)
    if problem:
        raise UsageProblem(problem)


def _load_path(config_file, via):
    """(the chosen path, what the config names: stages/config/paths.py's ConfigFiles)."""
    from stages.config.paths import ConfigError, choose_path, config_files, load_config  # as the policy's
    if config_file:
        _refuse_replaced(config_file, "--config")
    try:
        config = load_config(config_file) if config_file else None
        return choose_path(config, via), config_files(config)
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None


def _resolve_files(policy):
    """The policy's [files] table, resolved once for this run (stages/config/file_limits.py)."""
    if policy.files is None:
        return None
    # Only a policy with [files] loads file_limits (tests/test_startup_imports.py).
    from stages.config.file_limits import invoker_homes, resolve
    from stages.config.policy import PolicyError    # loaded already: the policy is
    home, other_homes = invoker_homes(dict(os.environ))
    try:
        return resolve(policy.files, policy.source, home=home, cwd=os.getcwd(),
                       other_homes=other_homes)
    except PolicyError as exc:
        raise UsageProblem(str(exc)) from None


def _resolve_secrets(policy):
    """The policy's secrets read from their sources, now, outside, before the
    program starts (stages/config/secrets.py): a source that fails stops the
    run (121), naming the secret and the source, never a value."""
    if not policy.secrets:
        return None
    # Only a policy with secrets loads their module.
    from stages.config import secrets as sc
    from stages.config.lookups import invoker_homes      # after the helper's fork, as the policy
    from stages.config.policy import localhost_ports     # loaded already: the policy is
    env = dict(os.environ)
    home, _ = invoker_homes(env)
    try:
        return sc.resolve(policy.secrets, env, home=home, taken_ports=localhost_ports(policy),
                          where=policy.source or "policy")
    except sc.SourceError as exc:
        raise UsageProblem(str(exc)) from None


def _check_syslog_target(target):
    if target is None:
        return None
    from stages.recorder.shipping.transports import TargetError, parse_target  # only with --syslog
    try:
        return str(parse_target(target))
    except TargetError as exc:
        raise UsageProblem(f"--syslog: {exc}") from None


def _check_side_outputs(events_to, syslog, events_format) -> str:
    """--events-to and --events-format as the options they are: a command that
    is there, a format only for an output that carries it."""
    if events_to is not None and not events_to.strip():
        raise UsageProblem("--events-to '': no command given; fix: name the command that reads the "
                           "events, e.g. --events-to 'cat >> events.jsonl', or leave the option out")
    if events_format is not None and events_to is None and syslog is None:
        raise UsageProblem(f"--events-format {events_format}: nothing carries the events; fix: add "
                           f"--events-to COMMAND or --syslog, or leave --events-format out (the "
                           f"record is always JSON Lines)")
    return events_format or "jsonl"


def execute(mode, program, **options) -> int:
    """run, trace or guard with the options click or options.quick_parse
    read (RunOptions' fields). A run that started ends the process here
    (exit_now) once its stages have ended; a refusal before that raises
    UsageProblem."""
    mark("vpnw", "command line parsed")
    exit_now(_start_run(_checked(RunOptions(mode=mode, program=tuple(program), **options))))


def _checked(options: RunOptions) -> RunOptions:
    """The options as one command line: what no single option can check."""
    if options.policy_file == "-" and options.config_file == "-":
        raise UsageProblem("--policy - and --config - both read stdin; fix: read one of them from a file")
    syslog = _check_syslog_target(options.syslog)
    events_format = _check_side_outputs(options.events_to, syslog, options.events_format)
    policy_file = options.policy_file
    if options.ask and policy_file and policy_file.startswith("@"):
        # An answer is written into the policy file: never into vpnw's own copy.
        raise UsageProblem(f"--ask edits the policy file, and {policy_file} is vpnw's own; "
                           f"fix: vpnw presets {policy_file[1:]} > policy.toml, then --policy policy.toml")
    return options.replace(syslog=syslog, events_format=events_format)


def _start_run(options: RunOptions) -> int:
    # The helper first, before the run's modules and the policy load: what
    # it does needs neither (helper_first.py); a refusal from here on kills it.
    terminal = helper_first.plan_terminal(options.record, options.log, options.no_clipboard,
                                          os.environ)
    helper = helper_first.fork_helper(list(options.program), options.allow_unix_sockets, terminal)
    say = OwnLines()
    try:
        request = RunRequest(options=options, plan=_plan(options, say))
    except BaseException:
        helper_first.abandon(helper)
        helper_first.close_terminal(terminal)
        raise
    # The run's modules load only now, after the helper's fork (tests/test_startup_imports.py).
    from stages.orchestrator.run import execute as run
    return run(request, terminal, helper, say)


def _plan(options: RunOptions, say: OwnLines) -> RunPlan:
    """The policy and the paths loaded (UsageProblem when they cannot be)."""
    # The policy's module loads after the helper's fork (tests/test_startup_imports.py).
    from stages.config.policy import check_policy_for_path
    policy = _load_policy(options.policy_file)
    path, named = _load_path(options.config_file, options.via)
    problem = check_policy_for_path(policy, path.resolves_at_exit) if options.policy_file else None
    if problem:
        raise UsageProblem(f"{policy.source}: {problem}")
    files = _resolve_files(policy)
    secrets = _resolve_secrets(policy)
    if options.allow_unix_sockets:
        say("--allow-unix-sockets: the program can reach every Unix socket on this machine "
            "(Docker, your ssh-agent, D-Bus), with no record of each connection; its own "
            "sockets work without it, and the policy's [unix] allow names the others it needs")
    plan = RunPlan(policy=policy, path=path, config_files=named, files=files, secrets=secrets,
                   ask=bool(options.mode == "guard" and (options.ask or policy.ask)),
                   capture=bool(options.capture or policy.capture))
    mark("vpnw", "policy and paths loaded")
    return plan


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown (module and GC clean-up costs
    ~10-20 ms of every `vpnw run`). Only after run/trace/guard, whose stages
    have all ended and whose record the recorder has closed; other commands
    may hold buffered files. Output is flushed first; if that fails, the
    ordinary exit reports it."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:    # None: vpnw was started with that fd closed
                stream.flush()
    except (OSError, ValueError):
        sys.exit(code)
    mark("vpnw", "exit")
    os._exit(code)

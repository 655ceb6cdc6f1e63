"""`vpnw`: the command line. Thin: it parses, loads the policy and the paths, and
hands a RunRequest to the orchestrator. Every bad command line, policy or config
exits 121 with a message that says what to fix; nothing is started before that."""
from __future__ import annotations

import gc
import importlib
import os
import signal
import sys

# No collection while vpnw starts: what it allocates now (modules, the
# policy) lives for the whole run, so a collection would find nothing to
# free, and a full one walks every object made so far (some 10-15 % of the
# imports' time). On again at the end of this module's imports; a run turns
# it off again until its stages are forked (_execute, run.py).
gc.disable()

from stages.wire.startup_trace import mark  # noqa: E402
mark("vpnw", "interpreter up")

import click  # noqa: E402

from stages import __version__
from stages.wire.exits import ExitCode, killed_by  # noqa: E402
gc.enable()
_ran_sandbox = False    # set once a run/trace/guard started: main may skip the teardown

# Subcommands that live with their stage; imported only when used, to keep start-up light.
LAZY_COMMANDS = {
    "learn": ("stages.learner.commands", "learn_command"),
    "doctor": ("stages.orchestrator.doctor", "doctor_command"),
    "runs": ("stages.recorder.commands", "runs_command"),
    "show": ("stages.recorder.commands", "show_command"),
    "ask": ("stages.orchestrator.ask_command", "ask_command"),
    "presets": ("stages.orchestrator.preset_command", "presets_command"),
    "key": ("stages.recorder.commands", "key_command"),
}


class UsageProblem(click.ClickException):
    exit_code = ExitCode.USAGE

    def format_message(self):
        return self.message

    def show(self, file=None):
        click.echo(f"vpnw: {self.message}", err=True)


# run, trace and guard, each made (its click options) only when named: a run
# builds one of the three, not all (_sandboxed).
SANDBOXED_COMMANDS = {}


class VpnwGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS) | set(SANDBOXED_COMMANDS))

    def get_command(self, ctx, name):
        if name in SANDBOXED_COMMANDS and name not in self.commands:
            self.add_command(SANDBOXED_COMMANDS[name](), name)
        if name in LAZY_COMMANDS:
            module, attr = LAZY_COMMANDS[name]
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.list_commands(ctx):
            # No such command: click's "Did you mean" looks among the
            # commands made so far, so make run, trace and guard first.
            for name in SANDBOXED_COMMANDS:
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)


@click.group(cls=VpnwGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vpnw")
def cli():
    """Run one program with a network of its own: a path, a policy and a record."""
    from stages.config.environment import check
    problem = check(dict(os.environ))     # like a bad option: before anything starts
    if problem:
        raise UsageProblem(problem)


def _load_policy(policy_file):
    from stages.config.policy import Policy, PolicyError, load_policy
    if not policy_file:
        return Policy.allow_all()
    if policy_file.startswith("@"):
        # A preset shipped with vpnw (stages/config/presets.py).
        from stages.config import presets
        try:
            policy_file = presets.path(policy_file[1:])
        except presets.UnknownPreset as exc:
            raise UsageProblem(f"--policy {policy_file}: {exc}") from None
    try:
        return load_policy(policy_file)
    except PolicyError as exc:
        raise UsageProblem(str(exc)) from None


def _load_path(config_file, via):
    """(the chosen path, what the config names: stages/config/paths.py's ConfigFiles)."""
    from stages.config.paths import ConfigError, choose_path, config_files, load_config
    try:
        config = load_config(config_file) if config_file else None
        return choose_path(config, via), config_files(config)
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None


def _resolve_files(policy):
    """The policy's [files] table, resolved once for this run (stages/config/file_limits.py)."""
    if getattr(policy, "files", None) is None:
        return None
    from stages.config.file_limits import invoker_homes, resolve
    from stages.config.policy import PolicyError
    home, other_homes = invoker_homes(dict(os.environ))
    try:
        return resolve(policy.files, policy.source, home=home, cwd=os.getcwd(),
                       other_homes=other_homes)
    except PolicyError as exc:
        raise UsageProblem(str(exc)) from None


def _sandboxed(mode: str, *, require_policy: bool):
    def decorate(fn):
        SANDBOXED_COMMANDS[mode] = lambda: _sandboxed_command(mode, require_policy, fn)
        return fn
    return decorate


def _sandboxed_command(mode: str, require_policy: bool, fn) -> click.Command:
    """The click command for run, trace or guard: fn with its options."""
    options = [
        # Plain strings: the loaders word every problem with a file the same way.
        click.option("--policy", "policy_file", metavar="FILE", required=require_policy,
                     help="Policy file (TOML) to enforce; '-' reads stdin; @NAME a preset "
                          "shipped with vpnw (`vpnw presets`)."),
        click.option("--config", "config_file", metavar="FILE",
                     help="Paths file (TOML) naming the ways out."),
        click.option("--via", metavar="NAME",
                     help="Name of the path to use (default: the config's default, else direct)."),
        click.option("--record", metavar="FILE", help="Write the record to FILE instead of the state directory; "
                                      "'-' writes it to stdout and moves the program's stdout to stderr."),
        click.option("--log", type=click.Path(dir_okay=False), metavar="FILE",
                     help="Write vpnw's human lines to FILE (appended) instead of stderr."),
        click.option("--quiet", is_flag=True,
                     help="Human lines: only denials and the summary."),
        click.option("--events-to", metavar="COMMAND",
                     help="Also feed the event stream (JSON Lines) to COMMAND's stdin (run by sh -c)."),
        click.option("--syslog", is_flag=False, flag_value="/dev/log", default=None, metavar="[TARGET]",
                     help="Also send every event to syslog: /dev/log (the default), another socket "
                          "path, udp://HOST:PORT or tcp://HOST:PORT (RFC 5424, JSON behind @cee:)."),
        click.option("--events-format", type=click.Choice(["jsonl", "ocsf", "ecs"]), default=None,
                     help="What --events-to and --syslog carry: the record's events (jsonl, the "
                          "default), or each connection outcome as OCSF Network Activity or ECS."),
        click.option("--allow-unix-sockets", is_flag=True,
                     help="Let the program reach every Unix socket on this machine (Docker, your "
                          "ssh-agent), datagram ones too; its own sockets work without it, and "
                          "the policy's [unix] allow names others. Recorded, with a warning."),
        click.option("--capture", is_flag=True,
                     help="Also take every TCP connection that ignores the proxy settings to the "
                          "policy (the policy's capture = true does the same)."),
        click.option("--no-clipboard", is_flag=True,
                     help="On a terminal, drop the program's OSC 52 sequences (which set or "
                          "read the clipboard of the terminal's desktop)."),
    ]
    if mode == "guard":
        options.append(click.option("--dry-run", is_flag=True,
                                    help="Decide and record what would be denied, but let it through."))
        options.append(click.option("--ask", is_flag=True,
                                    help="Ask the person on this terminal about a connection no rule "
                                         "allows, while it waits (also `ask = true` in the policy)."))
        options.append(click.option("--ask-timeout", type=click.FloatRange(min=1.0), default=60.0,
                                    show_default=True, metavar="SECONDS",
                                    help="An unanswered question is a denial after this long."))
    for option in reversed(options):
        fn = option(fn)
    fn = click.argument("program", nargs=-1, required=True, type=click.UNPROCESSED)(fn)
    # vpnw's options end at the first word that names the program (like sudo
    # and docker): `vpnw run echo --quiet` hands --quiet to echo.
    return click.command(mode, options_metavar="[OPTIONS] [--]",
                         context_settings={"ignore_unknown_options": False,
                                           "allow_interspersed_args": False})(fn)


def _check_syslog_target(target):
    if target is None:
        return None
    from stages.recorder.shipping.transports import TargetError, parse_target
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


def _execute(mode, program, policy_file, config_file, via, record, events_to,
             allow_unix_sockets, log=None, quiet=False, dry_run=False, syslog=None,
             events_format=None, ask=False, ask_timeout=60.0, capture=False,
             no_clipboard=False):
    mark("vpnw", "command line parsed")
    gc.disable()     # as at the top: on again once the stages are forked (run.py), or on a refusal
    try:
        return _start_run(mode, program, policy_file, config_file, via, record, events_to,
                          allow_unix_sockets, log, quiet, dry_run, syslog, events_format, ask,
                          ask_timeout, capture, no_clipboard)
    finally:
        gc.enable()


def _start_run(mode, program, policy_file, config_file, via, record, events_to,
               allow_unix_sockets, log, quiet, dry_run, syslog, events_format, ask, ask_timeout,
               capture, no_clipboard):
    from stages.orchestrator.run import RunRequest, execute
    from stages.config.policy import check_policy_for_path
    if policy_file == "-" and config_file == "-":
        raise UsageProblem("--policy - and --config - both read stdin; fix: read one of them from a file")
    syslog = _check_syslog_target(syslog)
    events_format = _check_side_outputs(events_to, syslog, events_format)
    if ask and policy_file and policy_file.startswith("@"):
        # An answer is written into the policy file: never into vpnw's own copy.
        raise UsageProblem(f"--ask edits the policy file, and {policy_file} is vpnw's own; "
                           f"fix: vpnw presets {policy_file[1:]} > policy.toml, then --policy policy.toml")
    policy = _load_policy(policy_file)
    path, named = _load_path(config_file, via)
    problem = check_policy_for_path(policy, path.resolves_at_exit) if policy_file else None
    if problem:
        raise UsageProblem(f"{policy.source}: {problem}")
    files = _resolve_files(policy)
    if allow_unix_sockets:
        from stages.orchestrator.run import say
        say("--allow-unix-sockets: the program can reach every Unix socket on this machine "
            "(Docker, your ssh-agent, D-Bus), with no record of each connection; its own "
            "sockets work without it, and the policy's [unix] allow names the others it needs")
    global _ran_sandbox
    _ran_sandbox = True
    request = RunRequest(mode=mode, argv=list(program), policy=policy, path=path, record=record,
                         events_to=events_to, allow_unix_sockets=allow_unix_sockets,
                         dry_run=dry_run, files=files, log=log, quiet=quiet,
                         syslog=syslog, events_format=events_format,
                         config_file=config_file, config_files=named,
                         ask=bool(mode == "guard" and (ask or getattr(policy, "ask", False))),
                         ask_timeout=ask_timeout,
                         capture=capture or getattr(policy, "capture", False),
                         no_clipboard=no_clipboard)
    mark("vpnw", "policy and paths loaded")
    return execute(request)


@_sandboxed("run", require_policy=False)
def run(program, **opts):
    """Run PROGRAM sealed, through the chosen path; print failures and a summary.

    \b
    Examples:
      vpnw run -- curl -sS https://example.com
      vpnw run --config office.toml --via office -- ./agent
    """
    return _execute("run", program, **opts)


@_sandboxed("trace", require_policy=False)
def trace(program, **opts):
    """Run PROGRAM sealed and print every connection as it happens.

    \b
    Examples:
      vpnw trace -- ./agent                  (then: vpnw learn > agent.toml)
      vpnw trace --record run.jsonl -- npm install
    """
    return _execute("trace", program, **opts)


@_sandboxed("guard", require_policy=True)
def guard(program, **opts):
    """Run PROGRAM sealed under a policy; any denial makes vpnw exit 120.

    \b
    Examples:
      vpnw guard --policy agent.toml -- ./agent
      vpnw guard --policy agent.toml --dry-run -- ./agent   (denies nothing, records what it would)
    """
    return _execute("guard", program, **opts)


def main(argv=None) -> None:
    mark("vpnw", "cli imported")
    try:
        code = cli.main(args=argv, prog_name="vpnw", standalone_mode=False)
    except click.exceptions.NoSuchOption as exc:
        click.echo(f"vpnw: {exc.format_message()} (put the program after `--`: vpnw run -- PROG ARGS)", err=True)
        sys.exit(ExitCode.USAGE)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code if isinstance(exc, UsageProblem) else ExitCode.USAGE)
    except click.exceptions.Abort:
        sys.exit(killed_by(signal.SIGINT))
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    code = code if isinstance(code, int) else 0
    if _ran_sandbox:
        _exit_now(code)
    sys.exit(code)


def _exit_now(code: int) -> None:
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


if __name__ == "__main__":
    main()

"""`vpnw`: the command line as click parses it. Thin: it parses, and
run_command.py checks the environment, loads the policy and the paths and
hands a RunRequest to the orchestrator. Every bad command line, policy or
config exits 121 with a message that says what to fix; nothing is started
before that. A run, trace or guard whose words parse cleanly does not come
here at all (main.py: options.quick_parse reads the same option table)."""
from __future__ import annotations

import importlib
import signal
import sys

import click

from stages import __version__
from stages.orchestrator import options as opt, run_command
from stages.orchestrator.run_command import (  # noqa: F401  (the names tests and callers use)
    UsageProblem, _check_side_outputs, _check_syslog_target, _load_path, _load_policy,
    _resolve_files,
)
from stages.wire.exits import ExitCode, killed_by
_execute = run_command.execute     # what run, trace and guard call (looked up here when called)

# Subcommands that live with their stage; imported only when used, to keep start-up light.
LAZY_COMMANDS = {
    "learn": ("stages.learner.commands", "learn_command"),
    "doctor": ("stages.orchestrator.doctor", "doctor_command"),
    "runs": ("stages.recorder.commands", "runs_command"),
    "show": ("stages.recorder.commands", "show_command"),
    "ask": ("stages.orchestrator.ask_command", "ask_command"),
    "presets": ("stages.orchestrator.preset_command", "presets_command"),
    "key": ("stages.recorder.commands", "key_command"),
    "changes": ("stages.recorder.changes", "changes_command"),
    "why": ("stages.orchestrator.why_command", "why_command"),
    "watch": ("stages.recorder.commands", "watch_command"),
}


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
    run_command.check_environment()     # like a bad option: before anything starts


def _sandboxed(mode: str):
    def decorate(fn):
        SANDBOXED_COMMANDS[mode] = lambda: _sandboxed_command(mode, fn)
        return fn
    return decorate


def _sandboxed_command(mode: str, fn) -> click.Command:
    """The click command for run, trace or guard: fn with its options."""
    options = [_click_option(o, mode) for o in opt.options_of(mode)]
    for option in reversed(options):
        fn = option(fn)
    fn = click.argument("program", nargs=-1, required=True, type=click.UNPROCESSED,
                        shell_complete=complete_program)(fn)
    # vpnw's options end at the first word that names the program (like sudo
    # and docker): `vpnw run echo --quiet` hands --quiet to echo.
    return click.command(mode, options_metavar="[OPTIONS] [--]",
                         context_settings={"ignore_unknown_options": False,
                                           "allow_interspersed_args": False})(fn)


def complete_policy(ctx, param, incomplete: str):
    """Tab after --policy: the presets for "@...", files otherwise."""
    from click.shell_completion import CompletionItem   # only when completing (Tab)
    from stages.config import presets    # only when completing (Tab)
    if incomplete.startswith(presets.MARK):
        return [CompletionItem(presets.MARK + name, help=presets.summary(name))
                for name in presets.names() if name.startswith(incomplete[1:])]
    return [CompletionItem(incomplete, type="file")]


def complete_program(ctx, param, incomplete: str):
    """bash breaks COMP_WORDS at "@" (COMP_WORDBREAKS): `--policy @cl`
    reaches click as --policy "@" and "cl", the program's first word, while
    readline replaces the whole "@cl": the preset is offered with its "@"."""
    from click.shell_completion import CompletionItem   # only when completing (Tab)
    from stages.config import presets    # only when completing (Tab)
    if ctx.params.get("policy_file") == presets.MARK and not ctx.params.get("program"):
        return [CompletionItem(presets.MARK + name, help=presets.summary(name))
                for name in presets.names() if name.startswith(incomplete)]
    return []


def _click_option(option: opt.Option, mode: str):
    """One row of options.OPTIONS as a click option."""
    settings = {"metavar": option.metavar, "help": option.help}
    if option.name == "--policy":
        settings["shell_complete"] = complete_policy
    if mode in option.required_in:
        settings["required"] = True
    if option.kind == opt.FLAG:
        settings["is_flag"] = True
    elif option.kind == opt.FILE:
        settings["type"] = click.Path(dir_okay=False)
    elif option.kind == opt.TEXT_OR_FLAG:
        settings.update(is_flag=False, flag_value=option.flag_value, default=None)
    elif option.kind == opt.CHOICE:
        settings.update(type=click.Choice(list(option.choices)), default=None)
    elif option.kind == opt.SECONDS:
        settings.update(type=click.FloatRange(min=option.minimum), default=option.default,
                        show_default=True)
    return click.option(option.name, option.dest, **settings)


@_sandboxed("run")
def run(program, **opts):
    """Run PROGRAM sealed, through the chosen path; print failures and a summary.

    \b
    Examples:
      vpnw run -- curl -sS https://example.com
      vpnw run --config office.toml --via office -- ./agent
    """
    return _execute("run", program, **opts)


@_sandboxed("trace")
def trace(program, **opts):
    """Run PROGRAM sealed and print every connection as it happens.

    \b
    Examples:
      vpnw trace -- ./agent                  (then: vpnw learn > agent.toml)
      vpnw trace --record run.jsonl -- npm install
    """
    return _execute("trace", program, **opts)


@_sandboxed("guard")
def guard(program, **opts):
    """Run PROGRAM sealed under a policy; any denial makes vpnw exit 120.

    \b
    Examples:
      vpnw guard --policy agent.toml -- ./agent
      vpnw guard --policy agent.toml --dry-run -- ./agent   (denies nothing, records what it would)
    """
    return _execute("guard", program, **opts)


def _unknown_option_hint(exc: click.exceptions.NoSuchOption, argv) -> str:
    """What follows click's "No such option": the program goes after `--`
    only where that is the likely mistake (run, trace or guard typed with no
    `--`: with one, the option stood before it, so it was meant for vpnw),
    named with the command that was typed."""
    words = list(sys.argv[1:] if argv is None else argv)
    command = exc.ctx.info_name if exc.ctx is not None else None
    if command in ("run", "trace", "guard"):
        option = exc.option_name
        if "--" not in words:
            return (f" (vpnw's options come before the program; if {option} is the program's, "
                    f"put the program after `--`: vpnw {command} [OPTIONS] -- PROGRAM {option})")
    return f" (see `vpnw {command} --help`)" if command and command != "vpnw" else " (see `vpnw --help`)"


def main(argv=None) -> None:
    """The command line through click: help, mistakes, every command but a
    cleanly written run, trace or guard (main.py)."""
    try:
        code = cli.main(args=argv, prog_name="vpnw", standalone_mode=False)
    except UsageProblem as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.NoSuchOption as exc:
        click.echo(f"vpnw: {exc.format_message()}{_unknown_option_hint(exc, argv)}", err=True)
        sys.exit(ExitCode.USAGE)
    except click.ClickException as exc:
        exc.show()
        sys.exit(ExitCode.USAGE)
    except click.exceptions.Abort:
        sys.exit(killed_by(signal.SIGINT))
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()

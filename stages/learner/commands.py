"""`vpnw learn`: a draft policy from the last trace (or the files given)."""
from __future__ import annotations

import itertools
import os
import sys
from typing import Iterator

import click
from click.shell_completion import CompletionItem

from stages.learner.draft import draft_policy
from stages.learner.learned import NoRuns
from stages.record.events import read_events, state_dir
from stages.record.evidence import warning_for
from stages.record.runs import (
    RUN_FILE_EXPECTED, AmbiguousRun, NotARunFile, RunNotFound, check_run_file, complete_run, first_line,
    first_line_problem, last_run, resolve_run,
)
from stages.wire.exits import ExitCode


def _events(sources: list[str], stdin_first: bytes | None) -> Iterator[dict]:
    for source in sources:
        if source == "-":
            yield from read_events(itertools.chain([stdin_first], sys.stdin.buffer))
            continue
        with open(source, "rb") as stream:
            yield from read_events(stream)


def learn(name: str | None, sources: tuple[str, ...], directory: str | None = None) -> int:
    """The command's body, callable without click: writes the draft to stdout."""
    files = list(sources)
    if not files:
        directory = directory or state_dir()
        last = last_run(directory, mode="trace")
        if last is None:
            click.echo(f"vpnw: no trace to learn from in {directory}; run `vpnw trace -- PROGRAM` "
                       "first, or give a run file with --from FILE", err=True)
            return ExitCode.USAGE
        files = [last]
    for n, source in enumerate(files):
        if source != "-" and not os.path.lexists(source):
            # A run id, or a prefix of one, as `vpnw show` takes it.
            try:
                files[n] = resolve_run(source, directory or state_dir())
            except AmbiguousRun as exc:
                click.echo(f"vpnw: --from: {exc}", err=True)
                return ExitCode.USAGE
            except RunNotFound:
                pass        # said below as a file that cannot be read
    if files.count("-") > 1:
        click.echo("vpnw: --from - (stdin) can be given only once", err=True)
        return ExitCode.USAGE
    stdin_first = None
    for source in files:
        try:
            if source == "-":
                stdin_first = first_line(sys.stdin.buffer)
                problem = first_line_problem(stdin_first)
                if problem:
                    raise NotARunFile(f"stdin (--from -) is not a vpnw run file: {problem}; "
                                      f"{RUN_FILE_EXPECTED}")
            else:
                check_run_file(source)
        except NotARunFile as exc:
            click.echo(f"vpnw: {exc}", err=True)
            return ExitCode.USAGE
        except OSError as exc:
            click.echo(f"vpnw: cannot read the run file {source}: {exc.strerror or exc}; "
                       "fix: give an existing file to --from (see `vpnw runs`)", err=True)
            return ExitCode.USAGE
    for source in files:
        if source != "-":
            _warn_unless_verified(source)
    try:
        draft = draft_policy(_events(files, stdin_first), name,
                             ssh_auth_sock=os.environ.get("SSH_AUTH_SOCK") or None)
    except NoRuns:
        click.echo(f"vpnw: no run to learn from in {', '.join(files)}: no run.start was read; "
                   f"{RUN_FILE_EXPECTED}", err=True)
        return ExitCode.USAGE
    sys.stdout.write(draft)
    sys.stdout.flush()
    return 0


def _warn_unless_verified(path: str) -> None:
    # learn drafts from evidence: a rewritten or replaced run file is said first.
    warning = warning_for(path)
    if warning:
        click.echo(f"vpnw: {warning}", err=True)


def _complete_source(ctx, param, incomplete: str):
    """Tab after --from: the run ids that begin so; files for a path."""
    found = complete_run(incomplete, (ctx.params.get("directory") if ctx else None) or state_dir())
    return [CompletionItem(incomplete, type="file")] if found is None else \
        [CompletionItem(i) for i in found]


@click.command("learn")
@click.option("--name", default=None, metavar="NAME",
              help="The policy's name (default: the program of the first run).")
@click.option("--from", "sources", multiple=True, metavar="FILE|RUN", shell_complete=_complete_source,
              help="Run file(s) or run ids (a prefix will do) to learn from, merged; '-' reads "
                   "stdin. Default: the last trace.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None, hidden=True)
def learn_command(name: str | None, sources: tuple[str, ...], directory: str | None) -> None:
    """Draft a policy from the last trace; read it before you use it."""
    code = learn(name, sources, directory)
    if code:
        sys.exit(code)

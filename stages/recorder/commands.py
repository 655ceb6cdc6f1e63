"""`vpnw runs` and `vpnw show`: thin click shells over runs.py."""
from __future__ import annotations

import sys

import click
import orjson

from stages.record.destinations import destinations
from stages.wire.exits import ExitCode
from stages.record.events import read_events, state_dir
from stages.record import runs as runs_mod
from stages.record.text import human_bytes, printable
from stages.recorder.human import human_lines


def _emit_json(value) -> None:
    sys.stdout.buffer.write(orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n")


def _runs_dir(directory: str | None) -> str:
    return directory or state_dir()


def _begins_chained(path: str) -> bool:
    from stages.record.events import split_digest
    with open(path, "rb") as stream:
        first = stream.readline(1 << 16)
    return split_digest(first.rstrip(b"\n")) is not None


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                 for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return lines


def _start_text(ts: str | None) -> str:
    # "2026-09-29T11:44:36.754728731Z" -> "2026-09-29 11:44:36Z": enough to tell runs apart.
    return f"{ts[:10]} {ts[11:19]}Z" if ts else "?"


@click.command("runs")
@click.option("--json", "as_json", is_flag=True, help="One JSON array, for machines.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None, hidden=True)
def runs_command(as_json: bool, directory: str | None) -> None:
    """List recorded runs, newest first."""
    directory = _runs_dir(directory)
    summaries = runs_mod.list_runs(directory)
    if as_json:
        _emit_json([s.as_dict() for s in summaries])
        return
    if not summaries:
        click.echo(f"no runs recorded in {directory}", err=True)
        return
    rows = [["RUN", "START (UTC)", "MODE", "PROGRAM", "CONNS", "DENIED", "FAILED", "EXIT"]]
    for s in summaries:
        rows.append([printable(s.id), _start_text(s.start), printable(s.mode or "?"),
                     printable(s.program or "?"), str(s.connections), str(s.denied),
                     str(s.failed), "-" if s.exit_code is None else str(s.exit_code)])
    for line in _table(rows, right={4, 5, 6, 7}):
        click.echo(line)


@click.command("show")
@click.argument("run", required=False)
@click.option("--summary", is_flag=True, help="A table per destination instead of every step.")
@click.option("--json", "as_json", is_flag=True, help="JSON for machines (the run and its destinations).")
@click.option("--format", "fmt", type=click.Choice(["ocsf", "ecs"]), default=None,
              help="Each connection outcome as JSON Lines: OCSF Network Activity (4001) or ECS.")
@click.option("--verify", is_flag=True,
              help="Check the run file's digest chain: exit 0 whole and unaltered, 1 cut or "
                   "changed (and where), 2 no chain to check (an older vpnw wrote it).")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None, hidden=True)
def show_command(run: str | None, summary: bool, as_json: bool, fmt: str | None, verify: bool,
                 directory: str | None) -> None:
    """Show a recorded run: RUN is a run id, a run file, or nothing for the newest."""
    if fmt and (summary or as_json):
        click.echo("vpnw: --format cannot be combined with --summary or --json", err=True)
        sys.exit(ExitCode.USAGE)
    if verify and (fmt or summary or as_json):
        click.echo("vpnw: --verify cannot be combined with --summary, --json or --format", err=True)
        sys.exit(ExitCode.USAGE)
    directory = _runs_dir(directory)
    try:
        path = runs_mod.resolve_run(run, directory)
        if not verify or not _begins_chained(path):
            # A first line that is not even a chained line: a run file of an
            # older vpnw (then --verify says so), or no run file at all (121).
            runs_mod.check_run_file(path)
    except (runs_mod.RunNotFound, runs_mod.NotARunFile) as exc:
        click.echo(f"vpnw: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    except OSError as exc:
        click.echo(f"vpnw: cannot read the run file {run}: {exc.strerror or exc}", err=True)
        sys.exit(ExitCode.USAGE)

    if verify:
        from stages.record.chain import verify as verify_chain
        with open(path, "rb") as stream:
            verdict = verify_chain(stream)
        text = f"{path}: {verdict.message}"
        if verdict.status == "whole":
            text += f"; last digest {verdict.digest}"
        click.echo(text)
        sys.exit(verdict.exit_code)

    if fmt:
        from stages.recorder.shipping import stream_renderer
        render = stream_renderer(fmt)
        out = sys.stdout.buffer
        with open(path, "rb") as stream:
            for event in read_events(stream):
                for doc in render(event, b""):
                    out.write(doc + b"\n")
        return

    if as_json:
        with open(path, "rb") as stream:
            table = destinations(read_events(stream))
        _emit_json({"run": runs_mod.summarize(path).as_dict(),
                    "destinations": [d.as_dict() for d in table]})
        return
    if summary:
        with open(path, "rb") as stream:
            table = destinations(read_events(stream))
        if not table:
            click.echo("no connections in this run")
            return
        rows = [["HOST", "PORT", "DECISION", "CONNS", "UP", "DOWN"]]
        for d in table:
            rows.append([printable(d.host), str(d.port), d.decision, str(d.requests),
                         human_bytes(d.bytes_up), human_bytes(d.bytes_down)])
        for line in _table(rows, right={1, 3, 4, 5}):
            click.echo(line)
        return
    with open(path, "rb") as stream:
        for line in human_lines(read_events(stream), record=path):
            click.echo(line)

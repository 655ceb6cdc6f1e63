"""`vpnw runs` and `vpnw show`: thin click shells over runs.py."""
from __future__ import annotations

import os
import sys

import click
import orjson
from click.shell_completion import CompletionItem

from stages.record import evidence, ledger, signing
from stages.record import runs as runs_mod
from stages.record.destinations import destinations
from stages.record.events import read_events, split_digest, state_dir
from stages.record.held import count as held_count
from stages.record.text import human_bytes, printable
from stages.recorder.human import human_lines
from stages.recorder.shipping import stream_renderer
from stages.recorder.watch import watch
from stages.wire.exits import ExitCode


def _emit_json(value) -> None:
    sys.stdout.buffer.write(orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n")


def _runs_dir(directory: str | None) -> str:
    return directory or state_dir()


def _begins_chained(path: str) -> bool:
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


def _evidence(path: str, key_file: str | None = None):
    return evidence.check(path, key=evidence.public_key_for(key_file), ledger=ledger.read())


def _verify(path: str, key_file: str | None) -> int:
    """`show --verify`: the chain's verdict on the first line (as it always
    was), then one line for the signature and one for the ledger."""
    try:
        found = _evidence(path, key_file)
    except signing.KeyProblem as exc:
        click.echo(f"vpnw: --key: {exc}", err=True)
        return ExitCode.USAGE
    verdict = found.chain_verdict
    text = f"{path}: {found.layers[0].message if found.running else verdict.message}"
    if verdict.status == "whole":
        text += f"; last digest {verdict.digest}"
    click.echo(text)
    for layer in found.layers[1:]:
        mark = {"ok": "", "failed": "FAILED: ", "absent": "not checked: ", "running": ""}[layer.status]
        click.echo(f"{layer.name}: {mark}{layer.message}")
    return found.exit_code


def _warn_unless_verified(path: str) -> None:
    """One line on stderr when the file does not verify: what follows may be
    a rewritten record."""
    warning = evidence.warning_for(path)
    if warning:
        click.echo(f"vpnw: {warning}", err=True)


@click.command("key")
@click.option("--rotate", is_flag=True,
              help="Make a new signing key; the old public key is kept beside it, so runs it "
                   "signed still verify with `vpnw show --verify --key FILE`.")
def key_command(rotate: bool) -> None:
    """Print the public key that signs this user's runs (minisign format)."""
    try:
        if rotate:
            old = signing.retire_key()
            if old:
                click.echo(f"vpnw: the old key's public half is kept as {old}; runs it signed "
                           f"verify with `vpnw show --verify --key {old}`", err=True)
        secret = signing.load_secret()
        public = signing.public_key_file(secret)
    except (signing.KeyProblem, OSError) as exc:
        click.echo(f"vpnw: {exc}", err=True)
        sys.exit(ExitCode.INTERNAL)
    with open(public, encoding="ascii") as stream:
        sys.stdout.write(stream.read())
    click.echo(f"vpnw: key {secret.id_text}, public key {public} (pin it elsewhere; check a run "
               f"with: minisign -V -p {public} -m RUN.jsonl)", err=True)


@click.command("runs")
@click.option("--json", "as_json", is_flag=True, help="One JSON array, for machines.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None, hidden=True)
def runs_command(as_json: bool, directory: str | None) -> None:
    """List recorded runs, newest first."""
    directory = _runs_dir(directory)
    summaries, gone, problem = runs_mod.with_ledger(runs_mod.list_runs(directory), directory)
    if problem:
        click.echo(f"vpnw: {problem}", err=True)
    # Held layers lie beside the runs (held/ next to runs/ in vpnw's state).
    held_root = os.path.join(os.path.dirname(os.path.abspath(directory)), "held")
    held = {s.id: held_count(s.id, held_root) for s in summaries}
    if as_json:
        _emit_json([{**s.as_dict(), "held": held[s.id] or 0} for s in summaries]
                   + [{"id": e.get("run"), "file": e.get("file"), "start": e.get("start"),
                       "ledger": "MISSING"} for e in gone])
        return
    if not summaries and not gone:
        click.echo(f"no runs recorded in {directory}", err=True)
        return
    rows = [["RUN", "START (UTC)", "MODE", "PROGRAM", "CONNS", "DENIED", "FAILED", "EXIT", "HELD",
             "LEDGER"]]
    for s in summaries:
        rows.append([printable(s.id), _start_text(s.start), printable(s.mode or "?"),
                     printable(s.program or "?"), str(s.connections), str(s.denied),
                     str(s.failed), s.state if s.exit_code is None else str(s.exit_code),
                     str(held[s.id]) if held[s.id] else "-", s.ledger])
    for e in gone:
        # In the ledger, and its file is gone: deleted or moved away.
        rows.append([printable(str(e.get("run"))), _start_text(e.get("start")), "-", "-", "-", "-",
                     "-", "-", "-", "MISSING"])
    for line in _table(rows, right={4, 5, 6, 7, 8}):
        click.echo(line)
    if any(held.values()):
        click.echo("HELD: writes a run made outside its work set, kept for you to review: "
                   "vpnw changes RUN")


def complete_run(ctx, param, incomplete: str):
    """Tab after `vpnw show`: the run ids that begin so; files for a path."""
    directory = (ctx.params.get("directory") if ctx is not None else None) or state_dir()
    found = runs_mod.complete_run(incomplete, directory)
    return [CompletionItem(incomplete, type="file")] if found is None else \
        [CompletionItem(i) for i in found]


def _run_file_or_exit(run: str | None, directory: str, check=lambda path: True) -> str:
    """RUN as `show` and `watch` take it, resolved to a run file; one line and
    exit 121 when it names none. `check(path)`: whether to check that the file
    begins like a run file."""
    try:
        path = runs_mod.resolve_run(run, directory)
        if check(path):
            runs_mod.check_run_file(path)
    except (runs_mod.RunNotFound, runs_mod.NotARunFile) as exc:
        click.echo(f"vpnw: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    except OSError as exc:
        click.echo(f"vpnw: cannot read the run file {run}: {exc.strerror or exc}", err=True)
        sys.exit(ExitCode.USAGE)
    return path


@click.command("show")
@click.argument("run", required=False, shell_complete=complete_run)
@click.option("--summary", is_flag=True, help="A table per destination instead of every step.")
@click.option("--json", "as_json", is_flag=True, help="JSON for machines (the run and its destinations).")
@click.option("--format", "fmt", type=click.Choice(["ocsf", "ecs"]), default=None,
              help="Each connection outcome as JSON Lines: OCSF Network Activity (4001) or ECS.")
@click.option("--verify", is_flag=True,
              help="Check the run file's digest chain, its signature and its entry in the ledger: "
                   "exit 0 all hold, 1 cut, changed, replaced or removed (and where), 2 nothing "
                   "to check against (no chain, no signature, or no key for it), 124 the run is "
                   "still going (what is there so far holds).")
@click.option("--key", "key_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="With --verify: the minisign public key to check the signature with "
                   "(default: this machine's, `vpnw key`).")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None, hidden=True)
def show_command(run: str | None, summary: bool, as_json: bool, fmt: str | None, verify: bool,
                 key_file: str | None, directory: str | None) -> None:
    """Show a recorded run: RUN is a run id, a run file, or nothing for the newest."""
    if fmt and (summary or as_json):
        click.echo("vpnw: --format cannot be combined with --summary or --json", err=True)
        sys.exit(ExitCode.USAGE)
    if verify and (fmt or summary or as_json):
        click.echo("vpnw: --verify cannot be combined with --summary, --json or --format", err=True)
        sys.exit(ExitCode.USAGE)
    if key_file and not verify:
        click.echo("vpnw: --key goes with --verify", err=True)
        sys.exit(ExitCode.USAGE)
    directory = _runs_dir(directory)
    # A first line that is not even a chained line: a run file of an older
    # vpnw (then --verify says so), or no run file at all (121).
    path = _run_file_or_exit(run, directory,
                             check=lambda path: not verify or not _begins_chained(path))

    if verify:
        sys.exit(_verify(path, key_file))
    _warn_unless_verified(path)

    if fmt:
        render = stream_renderer(fmt)
        out = sys.stdout.buffer
        with open(path, "rb") as stream:
            for event in runs_mod.in_time_order(read_events(stream)):
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
        for line in human_lines(runs_mod.in_time_order(read_events(stream)), record=path):
            click.echo(line)
    state = runs_mod.summarize(path).state
    if state != "ended":
        click.echo("vpnw  this run is still running: its record goes on" if state == "running" else
                   "vpnw  this run was cut short: vpnw ended without closing its record (no run.end); "
                   "what is above is all that was recorded")


@click.command("watch")
@click.argument("run", required=False)
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None, hidden=True)
def watch_command(run: str | None, directory: str | None) -> None:
    """Watch a run live: per destination, connections allowed, denied and
    failed, open now, bytes up and down, and the last reason. RUN is a run
    id, a run file, or nothing for the newest (a run going on in another
    terminal, or the last one). Follows the run file until the run ends;
    Ctrl-C stops watching, never the run."""
    directory = _runs_dir(directory)
    sys.exit(watch(_run_file_or_exit(run, directory)))

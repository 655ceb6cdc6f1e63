"""`vpnw changes`: a run's held writes for the person to review: list them,
diff the text ones, apply what the person names, drop the rest (a thin click
shell over stages/record/held.py; docs/security.md, "The work set and the held
layer")."""
from __future__ import annotations

import os
import sys

import click
import orjson

from stages.record import held as held_mod
from stages.record.text import human_bytes, printable
from stages.wire.exits import ExitCode

# Exit 1: something named could not be applied (changed since the run, or
# not held); the rest was.
NOT_ALL_APPLIED = 1


def _home_relative(path: str) -> str:
    home = os.path.expanduser("~")
    if path == home or path.startswith(home.rstrip("/") + "/"):
        path = "~" + path[len(home.rstrip("/")):]
    return printable(path)


def _mark(entry: held_mod.HeldEntry) -> str:
    if entry.kind == "deleted":
        return "D"
    if entry.kind in ("dir", "opaque-dir"):
        return "d" if entry.before.exists else "+"
    return "M" if entry.before.exists else "A"


def _runs_with_layers(root: str) -> list[str]:
    try:
        names = [n for n in os.listdir(root)
                 if os.path.isfile(os.path.join(root, n, held_mod.MANIFEST))]
    except FileNotFoundError:
        return []
    return sorted(names, key=lambda n: os.stat(os.path.join(root, n, held_mod.MANIFEST)).st_mtime,
                  reverse=True)


def resolve_held_run(word: str, root: str) -> str | None:
    """A run id as the person types it (r-36e0ba, 36e0ba, or an unambiguous
    start of one), among the runs that hold writes; None if it names none."""
    names = _runs_with_layers(root)
    for candidate in (word, "r-" + word):
        if candidate in names:
            return candidate
    hits = [n for n in names if n.startswith(word) or n.startswith("r-" + word)]
    if len(hits) > 1:
        raise click.UsageError(f"{word!r} could be any of {', '.join(sorted(hits))}: "
                               f"give more of the run id")
    return hits[0] if hits else None


def _fail(message: str, code: int = ExitCode.USAGE) -> None:
    click.echo(f"vpnw: {message}", err=True)
    sys.exit(code)


def _listing(held: held_mod.HeldRun) -> None:
    n = len(held.entries)
    click.echo(f"run {printable(held.run)} holds {n} write{'s' if n != 1 else ''} outside its "
               f"work set{' (the list was cut short)' if held.truncated else ''}; nothing "
               f"reached the real files")
    later = held.runs_later
    rest = [e for e in held.entries if not e.runs_later]
    width = max((len(_home_relative(e.path)) for e in held.entries), default=0)
    if later:
        click.echo("  would run later on its own (review these first):")
        for e in later:
            click.echo(f"    {_mark(e)} {_home_relative(e.path).ljust(width)}  "
                       f"{printable(e.runs_later)}")
    if rest:
        if later:
            click.echo("  other:")
        for e in rest:
            size = "" if e.kind in ("dir", "opaque-dir", "deleted") else human_bytes(e.size)
            click.echo(f"    {_mark(e)} {_home_relative(e.path).ljust(width)}  {size}".rstrip())
    click.echo(f"  (A added, M changed, D removed, + directory made) "
               f"vpnw changes {printable(held.run)} --diff | --apply PATH… | --drop [PATH…]")


def _as_json(held: held_mod.HeldRun) -> None:
    doc = {"run": held.run, "truncated": held.truncated,
           "entries": [{"path": e.path, "kind": e.kind, "size": e.size, "sha256": e.sha256,
                        "runs_later": e.runs_later, "before_exists": e.before.exists}
                       for e in held.entries]}
    sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")


def _held_run(words: list[str], root: str, named_only: bool):
    """(run id, its held writes, the PATHs after RUN) for the command's
    words: RUN when the first word names one, else the newest run that
    holds writes; None (said) when no run holds any."""
    run_id = resolve_held_run(words[0], root) if words else None
    if run_id is not None:
        words = words[1:]
    elif words and named_only:
        _fail(f"no held writes for run {printable(words[0])!s} in {root} "
              f"(`vpnw runs` shows which runs hold writes)")
    if run_id is None:
        newest = _runs_with_layers(root)
        if not newest:
            click.echo(f"no run holds writes (in {root})", err=True)
            return None
        run_id = newest[0]
    try:
        held = held_mod.load(run_id, root)
    except held_mod.HeldProblem as exc:
        _fail(str(exc), ExitCode.INTERNAL)
    if held is None:
        _fail(f"run {printable(run_id)} holds no writes")
    return run_id, held, words


def _apply_or_drop(held: held_mod.HeldRun, run_id: str, words: list[str], drop: bool) -> int:
    """--apply or --drop of the named PATHs; the exit code."""
    chosen, unmatched = held_mod.select(held, words)
    for name in unmatched:
        click.echo(f"vpnw: {printable(name)}: not among run {printable(run_id)}'s held writes",
                   err=True)
    if drop:
        held_mod.drop(held, [e.path for e in chosen])
        click.echo(f"dropped {len(chosen)} held write{'s' if len(chosen) != 1 else ''}; "
                   f"{len(held.entries)} left")
        return NOT_ALL_APPLIED if unmatched else 0
    done = []
    for entry in chosen:
        result = held_mod.apply_entry(held, entry)
        mark = "applied" if result.done else "REFUSED"
        click.echo(f"{mark}  {_home_relative(entry.path)}  {printable(result.why)}")
        if result.done:
            done.append(entry)
    held_mod.forget(held, done)
    return 0 if len(done) == len(chosen) and not unmatched else NOT_ALL_APPLIED


@click.command("changes")
@click.argument("words", nargs=-1, metavar="RUN|PATH")
@click.option("--diff", "show_diff", is_flag=True,
              help="A diff of each held text file against the real one (PATHs: only those).")
@click.option("--apply", "apply", is_flag=True,
              help="Write the named PATHs (a directory: all held under it) to the real files; "
                   "a file changed since the run is refused.")
@click.option("--drop", is_flag=True,
              help="Forget the named PATHs' held writes, or the run's whole layer without PATHs.")
@click.option("--json", "as_json", is_flag=True, help="The list as JSON, for machines.")
@click.option("--dir", "root", type=click.Path(file_okay=False), default=None, hidden=True)
def changes_command(words: tuple[str, ...], show_diff: bool, apply: bool, drop: bool,
                    as_json: bool, root: str | None) -> None:
    """What RUN wrote outside its work set, held for you: nothing the program
    wrote there reached your files. RUN is a run id (or the start of one);
    without it, the newest run that holds writes.

    \b
    Examples:
      vpnw changes                          (list the newest run's held writes)
      vpnw changes r-36e0ba --diff ~/.bashrc
      vpnw changes r-36e0ba --apply ~/.cache/pip ~/.npmrc
      vpnw changes r-36e0ba --drop          (forget the rest)
    """
    if sum((show_diff, apply, drop)) > 1:
        _fail("--diff, --apply and --drop go one at a time")
    root = root or held_mod.held_root()
    held_mod.prune(root)
    found = _held_run(list(words), root, named_only=not (apply or drop or show_diff))
    if found is None:
        return
    run_id, held, words = found
    if apply or (drop and words):
        if not words:
            _fail("--apply needs the PATHs to apply (see the list: vpnw changes "
                  f"{printable(run_id)})")
        sys.exit(_apply_or_drop(held, run_id, words, drop))
    if drop:
        n = held_mod.drop(held)
        click.echo(f"dropped run {printable(run_id)}'s held layer ({n} write{'s' if n != 1 else ''})")
        return
    if show_diff:
        entries = held_mod.select(held, words)[0] if words else held.entries
        for entry in entries:
            click.echo(f"── {_home_relative(entry.path)}"
                       + (f"  ({printable(entry.runs_later)})" if entry.runs_later else ""))
            for line in held_mod.diff(held, entry):
                # Tabs are harmless on a terminal and matter in a diff; every
                # other control character is the program's and is escaped.
                click.echo("\t".join(printable(part) for part in line.split("\t")))
        return
    if as_json:
        _as_json(held)
        return
    _listing(held)

"""`vpnw presets [NAME]`: the policies shipped with vpnw (stages/config/presets.py)."""
from __future__ import annotations

import sys

import click
from click.shell_completion import CompletionItem

from stages.config import presets
from stages.wire.exits import ExitCode


def _complete_name(ctx, param, incomplete: str):
    bare = incomplete.removeprefix(presets.MARK)
    return [CompletionItem(name, help=presets.summary(name))
            for name in presets.names() if name.startswith(bare)]


@click.command("presets")
@click.argument("name", required=False, shell_complete=_complete_name)
def presets_command(name):
    """List the policies shipped with vpnw, one per agent; with NAME, print
    that one (to copy and edit). Use one as `--policy @NAME`."""
    if name is None:
        for each in presets.names():
            click.echo(f"@{each:<14} {presets.summary(each)}")
        return 0
    try:
        click.echo(presets.text(name.removeprefix("@")), nl=False)
    except presets.UnknownPreset as exc:
        click.echo(f"vpnw: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    return 0

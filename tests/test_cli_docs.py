"""docs/commands.md and docs/vpnw.1 are what scripts/gen_cli_docs makes from
the click definitions today: a new command or flag, or a changed help text,
fails here until the generated files are committed again."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_committed_command_reference_is_current():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_cli_docs"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, ("docs/commands.md or docs/vpnw.1 is stale: run scripts/gen_cli_docs "
                               "with vpnw's venv and commit the result\n" + r.stdout + r.stderr)


def test_every_command_and_option_is_in_the_reference():
    """A second look, not through the generator: each command's every option
    name, as click has it, is in docs/commands.md under that command."""
    import click

    from stages.orchestrator.cli import cli
    doc = (ROOT / "docs" / "commands.md").read_text()
    top = click.Context(cli, info_name="vpnw")
    for name in cli.list_commands(top):
        command = cli.get_command(top, name)
        start = doc.index(f"\n## vpnw {name}\n")
        section = doc[start:doc.find("\n## ", start + 1)]
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                for flag in param.opts:
                    assert f"`{flag}`" in section, (name, flag)


def test_the_check_fails_on_a_stale_file(tmp_path):
    """The check itself: a copy of the repository's generator and docs with
    one line of docs/commands.md changed is reported stale (exit 1)."""
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    (copy / "docs").mkdir()
    (copy / "stages").symlink_to(ROOT / "stages")
    (copy / "scripts" / "gen_cli_docs").write_text((ROOT / "scripts" / "gen_cli_docs").read_text())
    (copy / "docs" / "vpnw.1").write_text((ROOT / "docs" / "vpnw.1").read_text())
    (copy / "docs" / "commands.md").write_text(
        (ROOT / "docs" / "commands.md").read_text().replace("| `--quiet` |", "| `--quite` |", 1))
    r = subprocess.run([sys.executable, str(copy / "scripts" / "gen_cli_docs"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "stale: docs/commands.md;" in r.stderr, r.stderr

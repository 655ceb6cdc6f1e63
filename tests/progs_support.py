"""tests/progs/: the programs the tests run, kept as files a linter reads
(issue 46) rather than as strings inside the tests."""
from __future__ import annotations

from pathlib import Path

PROGS = Path(__file__).resolve().parent / "progs"


def prog_text(name: str) -> str:
    """The text of tests/progs/<name>: to copy into the world with
    world.file (where every user of the test can read it, the sandbox
    included) or to hand to `python3 -c`."""
    return (PROGS / name).read_text()

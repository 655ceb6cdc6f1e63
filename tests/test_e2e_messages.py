"""What a person reads when something goes wrong, said once (issue 28,
"Messages"): a WireGuard path with the wrong key, on a real terminal.

The office is the test world's WireGuard peer (tests/wg_support.py); its
`wrong` path holds a private key the peer does not know, so the handshake
never completes and vpnw stops before the program with exit 123.
"""
from __future__ import annotations

import re
import shutil

import pytest

from ci_support import cannot
from tmux_support import world_shell
from wg_support import SITE, Office

pytestmark = pytest.mark.world


@pytest.fixture(scope="module")
def office(world):
    for tool in ("wireguard-go", "wg"):
        if shutil.which(tool) is None:
            cannot(f"{tool} is not installed (scripts/setup installs wireguard-go wireguard-tools)")
    return Office(world)


@pytest.fixture
def term(world, user, tmp_path):
    screen = world_shell(world, user, tmp_path)
    try:
        yield screen
    finally:
        screen.close()


def _after_prompt(history: str, typed: str) -> str:
    """What appeared on the pane after the line typed (the command's output)."""
    start = history.index(typed) + len(typed)
    return history[start:]


@pytest.mark.parametrize("mode", ["run", "trace", "quiet"])
def test_the_wrong_key_is_said_once(world, office, term, mode):
    marker = term.work / f"wrong-key-ran-{mode}"
    args = {"run": "run", "trace": "trace", "quiet": "run --quiet"}[mode]
    command = (f"VPNW_WG_HANDSHAKE_TIMEOUT=3 {term.vpnw} {args} --config {office.config} "
               f"--via wrong -- touch {marker}")
    mark = term.start(command)
    assert term.finished(mark, timeout=120) == 123
    assert not marker.exists()
    shown = _after_prompt(term.history(), command)
    shown = shown[:shown.index(f"@@{mark}@@42@@")]
    # The fact (which endpoint, and the likely causes) appears exactly once...
    assert shown.count(f"no handshake with {SITE}:") == 1, shown
    assert shown.count("a wrong key") == 1, shown
    # ...in the sentence that says what vpnw did about it, and the summary follows.
    assert re.search(r"^vpnw: the path 'wrong' is down: .*no handshake with ", shown, re.M), shown
    assert "the program was not started" in shown, shown
    assert re.search(r"^vpnw .*run r-[0-9a-f]+: 0 connections, 0 denied, 0 failed; exit 123", shown,
                     re.M), shown
    if mode == "trace":      # the trace still shows the path check's own line, without the repeat
        assert re.search(r"path wrong DOWN", shown), shown
    else:                    # all vpnw says: the one message and the summary (was ~1,000 characters)
        said = [line for line in shown.splitlines() if line.startswith("vpnw")]
        assert len(said) == 2 and sum(len(line) for line in said) < 600, said

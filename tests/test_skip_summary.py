"""scripts/skip_summary (run by .ci/run): pytest's -rs lines, summed by reason."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "skip_summary"


def test_skips_are_summed_by_reason_most_first():
    text = ("SKIPPED [2] tests/test_a.py:12: tmux is missing\n"
            "SKIPPED [1] tests/test_b.py:3: tmux is missing\n"
            "SKIPPED [4] tests/test_c.py: node is old\n= 3 passed, 7 skipped =\n")
    out = subprocess.run([sys.executable, str(SCRIPT)], input=text, capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines() == ["skipped: 7 tests by reason:", "      4  node is old",
                                "      3  tmux is missing"]

"""What vpnw says at the end of a run, as a person at a terminal sees it
(issue 45), in the test world, as root and as the unprivileged user: no hint
after the person stopped the program with Ctrl-C, whatever it met before."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.world

# One direct try the sandbox refuses (no route: it is not a door), then the program waits.
TRY_THEN = "bash -c 'echo > /dev/tcp/10.7.0.1/80; echo tried-once; {then}'"


@pytest.mark.parametrize("ending", ["ctrl-c", "own-exit"])
def test_no_hint_after_ctrl_c(world, term, ending):
    then = "sleep 300" if ending == "ctrl-c" else "exit 7"
    mark = term.start(f"{term.vpnw} run -- {TRY_THEN.format(then=then)}")
    term.wait_for(r"^tried-once", whole=True)
    if ending == "ctrl-c":
        term.keys("C-c")
        assert term.finished(mark) == 130
        # The summary is there; no hint blames the refused try for the person's Ctrl-C.
        history = term.history()
        assert "vpnw  run r-" in history, history
        assert "hint:" not in history, history
    else:   # the control: the same try, the program's own failure, gets the hint
        assert term.finished(mark) == 7
        term.wait_for(r"vpnw: hint: the program exited 7 after 1 try at a way out other than "
                      r"vpnw's doors", whole=True)

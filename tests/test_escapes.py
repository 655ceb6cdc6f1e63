"""Escape sequences vpnw follows in the program's terminal output (issue 32,
finding 10; stages/orchestrator/escapes.py): the alternate screen in any
spelling a terminal obeys, and OSC 52 dropped for --no-clipboard. Pure: every
case is also fed byte by byte, so a sequence split across reads is seen whole."""
from __future__ import annotations

import pytest

from stages.orchestrator.escapes import ClipboardFilter, ScreenModes


def screen_after(data: bytes, *, bytewise: bool = False) -> bool:
    modes = ScreenModes()
    if bytewise:
        for i in range(len(data)):
            modes.feed(data[i:i + 1])
        return modes.alternate
    return modes.feed(data)


ENTERS = [
    b"\x1b[?1049h", b"\x1b[?1047h", b"\x1b[?47h",
    b"\x1b[?1;1049h",                 # the red team's: a mode list, 1049 not first
    b"\x1b[?1049;1h", b"\x1b[?25;47;7h", b"\x1b[?;1049h",
    b"\x1b[?001049h",                 # leading zeros
    b"\x1b[?1:2;1049h",               # a sub-parameter before it
    b"\x1b[?10\r49h", b"\x1b[?10\x0749h", b"\x1b[?1049\nh",  # C0 inside: executed, the sequence goes on
    b"\x1b[?10\x7f49h",               # DEL inside: ignored
    b"\x1b\x01[?1049h",               # C0 between ESC and [
    b"\x1b]0;title\x07\x1b[?1049h",   # after an OSC
    b"\x1bPq\x1b[?1049h",             # an ESC ends a DCS and starts the next sequence
    b"\x1b[31\x1b[?1049h",            # an ESC restarts a sequence
    b"text \x1b[1mbold\x1b[0m \x1b[?1049h more",
]

NOT_ENTERS = [
    b"\x1b[1049h",                    # no '?': ANSI mode 1049, not the screen
    b"\x1b[?10490h", b"\x1b[?11049h", b"\x1b[?1049x",
    b"\x1b[?1049$h",                  # an intermediate: another function
    b"\x1b[?1049\x18h",               # CAN aborts it
    b"\x1b[?1049\x1ah",               # SUB aborts it
    b"\x1b[?1?1049h",                 # a second private marker: ignored by terminals
    b"[?1049h", b"\x1b]1049h", b"\x1b]0;[?1049h\x07",   # in a title
]


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-by-byte"])
@pytest.mark.parametrize("data", ENTERS)
def test_every_spelling_of_entering_the_alternate_screen_is_seen(data, bytewise):
    assert screen_after(data, bytewise=bytewise)


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-by-byte"])
@pytest.mark.parametrize("data", NOT_ENTERS)
def test_look_alikes_do_not_count(data, bytewise):
    assert not screen_after(data, bytewise=bytewise)


@pytest.mark.parametrize("leave", [b"\x1b[?1049l", b"\x1b[?1;1049l", b"\x1b[?7;47;25l",
                                   b"\x1b[?1047l"])
def test_leaving_in_any_spelling(leave):
    assert screen_after(b"\x1b[?1049h" + leave) is False
    assert screen_after(b"\x1b[?1049h" + leave + b"\x1b[?2004;1049h") is True


def test_a_restored_mode_switches_the_screen_back():
    # Save the mode while on the alternate screen, leave, restore: back on it.
    assert screen_after(b"\x1b[?1049h\x1b[?1049s\x1b[?1049l\x1b[?1049r") is True
    assert screen_after(b"\x1b[?1049s\x1b[?1049h\x1b[?1;1049r") is False
    assert screen_after(b"\x1b[?1049h\x1b[?1049r") is True      # nothing saved: unchanged


def test_huge_parameters_stay_bounded():
    assert screen_after(b"\x1b[?" + b"9" * 100_000 + b";1049h") is True
    assert screen_after(b"\x1b[?" + b"1;" * 100_000 + b"1049h") is True


# ── OSC 52 ──────────────────────────────────────────────────────────────

def filtered(data: bytes, *, bytewise: bool = False) -> bytes:
    f = ClipboardFilter()
    if bytewise:
        out = b"".join(f.feed(data[i:i + 1]) for i in range(len(data)))
    else:
        out = f.feed(data)
    return out + f.finish()


CLIPBOARD = [
    (b"a\x1b]52;c;aGVsbG8=\x07b", b"ab"),                  # set, BEL-terminated
    (b"a\x1b]52;c;aGVsbG8=\x1b\\b", b"ab"),                # set, ST-terminated
    (b"a\x1b]52;c;?\x07b", b"ab"),                         # a query: the answer would be typed in
    (b"a\x1b]052;p;eA==\x07b", b"ab"),                     # leading zero
    (b"a\x1b\r]52;c;eA==\x07b", b"a\rb"),                  # C0 inside: executed, kept
    (b"a\x1b]5\n2;c;eA==\x07b", b"a\nb"),
    (b"\x1b\x1b]52;c;eA==\x07", b"\x1b"),                  # tmux passthrough doubles the ESC
    (b"a\x1b]52;c;eA==\x18b", b"ab"),                      # CAN ends it
    (b"a\x1b]52;c;eA==\x1b[1mb", b"a\x1b[1mb"),            # ESC ends it, the next sequence stays
    (b"\x1b]52;c;" + b"A" * 100_000 + b"\x07x", b"x"),
]

KEPT = [
    b"\x1b]0;title\x07", b"\x1b]8;;https://example.org\x1b\\link\x1b]8;;\x1b\\",
    b"\x1b]520;x\x07", b"\x1b]5;2\x07", b"\x1b[52;1H", b"\x1b]52", b"\x1b]", b"\x1b",
    b"plain text \x1b[?1049h", "ünïcødé \u2502".encode(),
]


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-by-byte"])
@pytest.mark.parametrize("data,expected", CLIPBOARD)
def test_osc_52_is_dropped(data, expected, bytewise):
    assert filtered(data, bytewise=bytewise) == expected


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-by-byte"])
@pytest.mark.parametrize("data", KEPT)
def test_everything_else_passes_unchanged(data, bytewise):
    assert filtered(data, bytewise=bytewise) == data

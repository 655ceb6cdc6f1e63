"""The line-boundary merger (stages/orchestrator/line_merger.py): pure, fed bytes and a clock."""
from __future__ import annotations

import random

from stages.orchestrator.line_merger import LineMerger, display_width


def merger(**kw) -> LineMerger:
    kw.setdefault("hold", 0.5)
    kw.setdefault("columns", 80)
    kw.setdefault("rows", 24)
    return LineMerger(**kw)


def test_program_bytes_pass_unchanged_and_at_once():
    m = merger()
    assert m.program_output(b"abc", 0.0) == b"abc"
    assert m.program_output(b"\x1b[31mred\x1b[0m\r\n", 0.0) == b"\x1b[31mred\x1b[0m\r\n"
    assert m.program_output(b"", 0.0) == b""


def test_a_line_at_a_boundary_goes_out_at_once():
    m = merger()
    assert m.human_line(b"vpnw one", 0.0) == b"vpnw one\r\n"
    m.program_output(b"done\r\n", 0.1)
    assert m.human_line(b"vpnw two\n", 0.2) == b"vpnw two\r\n"


def test_a_line_waits_for_the_programs_newline():
    m = merger()
    assert m.program_output(b"half a ", 0.0) == b"half a "
    assert m.human_line(b"vpnw held", 0.1) == b""
    assert m.deadline() == 0.6
    assert m.program_output(b"line\r\n", 0.2) == b"line\r\nvpnw held\r\n"
    assert m.deadline() is None


def test_the_newline_may_be_inside_a_later_chunk():
    m = merger()
    m.program_output(b"abc", 0.0)
    m.human_line(b"v1", 0.0)
    m.human_line(b"v2", 0.0)
    assert m.program_output(b"def\r\nghi", 0.1) == b"def\r\nghi"
    assert m.program_output(b"\r\n", 0.2) == b"\r\nv1\r\nv2\r\n"


def test_after_the_hold_a_prompt_is_erased_and_shown_again_below():
    m = merger()
    m.program_output(b"Passphrase: ", 0.0)
    assert m.human_line(b"vpnw DENY x", 1.0) == b""
    assert m.tick(1.4) == b""
    assert m.tick(1.5) == b"\r\x1b[Jvpnw DENY x\r\nPassphrase: "
    # Still mid-line: the program's answer continues the prompt.
    assert m.program_output(b"\r\n", 2.0) == b"\r\n"


def test_a_wrapped_half_line_is_erased_over_all_its_rows():
    m = merger(columns=10)
    m.program_output(b"x" * 25, 0.0)          # three rows: 10 + 10 + 5
    m.human_line(b"v", 0.0)
    assert m.tick(1.0) == b"\x1b[2A\r\x1b[Jv\r\n" + b"x" * 25
    m2 = merger(columns=10)
    m2.program_output(b"x" * 20, 0.0)          # exactly two rows: the cursor waits on the second
    m2.human_line(b"v", 0.0)
    assert m2.tick(1.0) == b"\x1b[1A\r\x1b[Jv\r\n" + b"x" * 20


# What bash (readline, Debian's 5.2) writes for `PS1='\[\e[01;32m\]me\[\e[0m\]$ '`,
# then for typing "echo hal", Backspace, "l", Left twice, "X" (inserted).
READLINE = (b"\x1b[?2004h\x1b[01;32mme\x1b[0m$ " + b"echo hal" + b"\x08 \x08" + b"l"
            + b"\x08\x08" + b"\x1b[1@X")


def test_a_readline_prompt_and_the_half_typed_input_are_drawn_again_below():
    m = merger()
    m.program_output(b"line\r\n" + READLINE, 0.0)
    m.human_line(b"vpnw DENY x", 0.0)
    # Erased, vpnw's line, then the prompt (its colour) and "echo hXal", the
    # cursor back on the "a" where readline left it.
    assert m.tick(0.5) == (b"\r\x1b[Jvpnw DENY x\r\n"
                           b"\x1b[0m\x1b[01;32mme\x1b[0m$ echo hXal\x1b[2D")
    # readline goes on editing from there: its next bytes land where it thinks.
    assert m.program_output(b"\x1b[1@Y", 0.6) == b"\x1b[1@Y"


def test_a_progress_bar_is_drawn_again_as_it_stands():
    m = merger()
    m.program_output(b"progress 10%\rprogress 20%", 0.0)
    m.human_line(b"v", 0.0)
    assert m.tick(0.5) == b"\r\x1b[Jv\r\nprogress 20%"


def test_rebuild_follows_what_one_line_shows():
    from stages.orchestrator.half_line import rebuild
    assert rebuild(READLINE, 80) == (b"\x1b[0m\x1b[01;32mme\x1b[0m$ echo hXal\x1b[2D", 13, 11)
    assert rebuild(b"abcdef\r\x1b[2Cx\x1b[K", 80).redraw == b"abx"        # erased to the end
    assert rebuild(b"abcdef\x1b[3G\x1b[2P", 80).redraw == b"abef\x1b[2D"  # two deleted at column 3
    assert rebuild(b"ab\x1b[4Cz\x1b]0;title\x07", 80).redraw == b"ab    z"  # a title draws nothing
    assert rebuild("日本\b\bx".encode(), 80).redraw == "日x".encode()   # half a wide one blanked
    assert rebuild(b"\x1b[31mred", 80).redraw == b"\x1b[0m\x1b[31mred"     # the colour stays set
    assert rebuild(b"x" * 80, 80) is None                                   # wraps: not one row
    for other in (b"up\x1b[A", b"\x1b[5;5H", b"\x1b[?1049h", b"tab\t", b"\x1b[", b"\x1b[4hins",
                  b"\xff"):
        assert rebuild(other, 80) is None, other


def test_a_half_line_that_cannot_be_replayed_gets_a_newline_first():
    for partial in (b"up\x1b[A", b"\x1b[?5hreverse", b"tab\there", b"\xff\xfe", b"x" * 80 + b"\x1b[1m"):
        m = merger()
        m.program_output(b"line\r\n" + partial, 0.0)
        m.human_line(b"v", 0.0)
        assert m.tick(0.5) == b"\r\nv\r\n", partial
        # vpnw's line ended the row: the next one goes out at once.
        assert m.human_line(b"w", 0.6) == b"w\r\n"


def test_a_half_line_taller_than_the_screen_is_not_erased():
    m = merger(columns=10, rows=3)
    m.program_output(b"x" * 31, 0.0)
    m.human_line(b"v", 0.0)
    assert m.tick(1.0) == b"\r\nv\r\n"


def test_the_alternate_screen_holds_lines_until_it_is_left():
    m = merger()
    m.program_output(b"\x1b[?1049h\x1b[H", 0.0)
    assert m.human_line(b"v1", 0.0) == b""
    assert m.deadline() is None
    m.program_output(b"screenful\r\n", 0.1)   # a newline there is no boundary of ours
    assert m.tick(10.0) == b""
    assert m.program_output(b"\x1b[?1049l", 11.0) == b"\x1b[?1049l"   # mid-line? no newline yet
    assert m.program_output(b"$ done\r\n", 11.1) == b"$ done\r\nv1\r\n"


def test_a_program_that_ends_in_the_alternate_screen_gets_the_screen_given_back():
    m = merger()
    m.program_output(b"\x1b[?1049h\x1b[?25l\x1b[?1000h\x1b[?2004h", 0.0)
    assert m.human_line(b"v1", 0.1) == b""
    out = m.program_ended()
    assert out.startswith(b"\x1b[?1049l\x1b[?25h") and b"\x1b[?1000l" in out and b"\x1b[?2004l" in out
    assert out.endswith(b"v1\r\n")       # the held line, below, on the user's screen
    assert m.human_line(b"summary", 0.2) == b"summary\r\n"
    assert m.program_ended() == b""        # once


def test_a_program_that_left_the_alternate_screen_itself_gets_nothing_more():
    m = merger()
    m.program_output(b"\x1b[?1049h\x1b[?1049l$ ", 0.0)
    assert m.program_ended() == b""


def test_alternate_screen_sequences_split_across_chunks():
    m = merger()
    for piece in (b"\x1b[?10", b"49h"):
        m.program_output(piece, 0.0)
    assert m.alternate
    m.program_output(b"\x1b[?1049", 0.0)
    m.program_output(b"l\r\n", 0.0)
    assert not m.alternate


def test_held_lines_are_bounded_and_the_loss_is_said():
    m = merger(max_held=3)
    m.program_output(b"\x1b[?1049h", 0.0)
    for i in range(10):
        m.human_line(b"v%d" % i, 0.0)
    out = m.finish()
    assert out.startswith(b"\r\nv7\r\nv8\r\nv9\r\n"), out
    assert b"7 of vpnw's lines were not shown" in out


def test_finish_ends_a_half_line_first():
    m = merger()
    m.program_output(b"no newline at the end", 0.0)
    m.human_line(b"summary", 0.0)
    assert m.finish() == b"\r\nsummary\r\n"
    assert merger().finish() == b""


def test_display_width():
    assert display_width(b"abc") == 3
    assert display_width("héllo".encode()) == 5
    assert display_width("日本".encode()) == 4
    assert display_width("e\u0301".encode()) == 1
    assert display_width(b"a\tb") is None
    assert display_width(b"a\x1b[0m") is None
    assert display_width(b"\xc3") is None


def test_never_a_line_of_vpnw_inside_a_line_of_the_program():
    """Random chunking of random output with lines of vpnw's in between: on
    the merged stream, every line of vpnw's sits between two of the
    program's newlines, unless the hold ran out (then it was erased and
    replayed whole). Here the clock never reaches the hold."""
    rng = random.Random(11)
    program = b"".join(b"P%04d:" % i + b"y" * rng.randrange(0, 300) + b"\r\n" for i in range(300))
    m = merger(columns=80)
    out = b""
    pos = 0
    n = 0
    while pos < len(program):
        step = rng.randrange(1, 200)
        out += m.program_output(program[pos:pos + step], 0.0)
        pos += step
        if rng.random() < 0.3:
            out += m.human_line(b"vpnw %d" % n, 0.0)
            n += 1
    out += m.finish()
    lines = out.split(b"\r\n")
    assert lines[-1] == b""
    ours = [ln for ln in lines[:-1] if ln.startswith(b"vpnw ")]
    theirs = [ln for ln in lines[:-1] if not ln.startswith(b"vpnw ")]
    assert len(ours) == n
    assert theirs == program.split(b"\r\n")[:-1]


# Issue 32, finding 10: the alternate screen entered by a mode list (more
# spellings in tests/test_escapes.py).

def test_the_merger_holds_lines_on_a_listed_alternate_screen():
    """The red team's case, end to end in the merger: before, `ESC[?1;1049h`
    let vpnw's DENY line out into the alternate screen, where it was lost."""
    m = LineMerger(hold=0.5)
    m.program_output(b"\x1b[?1;1049h\x1b[H", 0.0)
    assert m.human_line(b"vpnw DENY evil.example", 0.0) == b""
    assert m.tick(5.0) == b""
    out = m.program_output(b"\x1b[?1;1049l", 6.0) + m.program_output(b"\r\n", 6.1)
    assert b"vpnw DENY evil.example\r\n" in out


def test_control_a_plain_screen_lets_the_line_out_at_once():
    m = LineMerger(hold=0.5)
    m.program_output(b"\x1b[?1;25h\r\n", 0.0)
    assert m.human_line(b"vpnw DENY evil.example", 0.0) == b"vpnw DENY evil.example\r\n"

"""guard --ask's pure parts: the questions (one per destination, answers
with a scope and a duration, timeouts), the answer keys (only Ctrl-], the
question's code, then a letter, only while a question is open), where a
title may be written, what a question warns about, and the policy file
written back (tomlkit: comments and layout kept; in place, through the
directory opened at the start; refused when the file changed or was
replaced)."""
from __future__ import annotations

import asyncio
import os
import selectors
import socket

import pytest

from stages.broker.hold import Hold
from stages.orchestrator.asker import Asker

from stages.config.policy import parse_policy
from stages.config.policy_edit import EditRefused, add_rule, open_place, text_sha256, with_rule
from stages.orchestrator.ask import KeyFilter, Questions, Typed, rule_for, title, wildcard_for
from stages.orchestrator.escapes import mid_escape


def _add_rule(path, *args, **kwargs):
    place = open_place(str(path))
    try:
        return add_rule(place, *args, **kwargs)
    finally:
        place.close()


# ---- questions

def test_twenty_connections_to_one_host_are_one_question():
    qs = Questions(timeout=60)
    new = []
    for token in range(20):
        reply, question = qs.ask(token, "new.example", 443, "http", now=0.0)
        assert reply is None
        if question is not None:
            new.append(question)
    assert len(new) == 1 and len(new[0].waiting) == 20
    [(closed, replies)] = qs.answer(new[0], "run")
    assert closed is new[0] and sorted(r.token for r in replies) == list(range(20))
    assert all(r.allow and r.by == "person" and r.answer == "run" and
               r.scope == "new.example:443" for r in replies)
    # Later connections to it in the same run: answered at once, no question.
    reply, question = qs.ask(99, "new.example", 443, "http", now=1.0)
    assert question is None and reply.allow and reply.token == 99
    # Another port is another destination.
    assert qs.ask(100, "new.example", 80, "http", now=1.0)[1] is not None


def test_allow_now_is_for_the_connections_waiting_and_no_later_one():
    qs = Questions(timeout=60)
    _, q = qs.ask(1, "new.example", 443, "http", now=0.0)
    qs.ask(2, "new.example", 443, "http", now=0.0)
    [(_q, replies)] = qs.answer(q, "once")
    assert [(r.token, r.allow, r.answer) for r in replies] == [(1, True, "once"), (2, True, "once")]
    reply, again = qs.ask(3, "new.example", 443, "http", now=1.0)
    assert reply is None and again is not None          # asked again


def test_scopes_host_and_suffix_cover_what_they_say():
    qs = Questions(timeout=60)
    _, q = qs.ask(1, "raw.githubusercontent.com", 443, "http", now=0.0)
    _, other = qs.ask(2, "objects.githubusercontent.com", 443, "http", now=0.0)
    _, elsewhere = qs.ask(3, "githubusercontent.com", 443, "http", now=0.0)
    closed = qs.answer(q, "run", scope="suffix")
    # The open question the wildcard covers is answered with it; the bare
    # suffix is not under "*.githubusercontent.com".
    assert [c for c, _r in closed] == [q, other]
    assert all(r.scope == "*.githubusercontent.com" for _c, rs in closed for r in rs)
    assert list(qs.open.values()) == [elsewhere]
    reply, _ = qs.ask(4, "x.y.githubusercontent.com", 8443, "socks", now=1.0)
    assert reply.allow and reply.answer == "run"
    # A host's own answer wins over its suffix's.
    _, pypi = qs.ask(5, "a.pythonhosted.org", 443, "http", now=1.0)
    qs.answer(pypi, "deny", scope="host")
    assert not qs.ask(6, "a.pythonhosted.org", 80, "http", now=1.0)[0].allow
    assert qs.ask(7, "b.pythonhosted.org", 443, "http", now=1.0)[1] is not None


def test_wildcards_offered_and_rules_as_written():
    assert wildcard_for("raw.githubusercontent.com") == "*.githubusercontent.com"
    assert wildcard_for("api.github.com") == "*.github.com"
    for host in ("pypi.org", "a.co.uk", "x.com.au", "10.0.0.1", "2001:db8::1", "localhost"):
        assert wildcard_for(host) is None, host
    assert rule_for("pypi.org", 443, "host") == "pypi.org"
    assert rule_for("a.b.example", 443, "suffix") == "*.b.example"
    for rule in ("pypi.org", "*.b.example", "2001:db8::1"):
        parse_policy(f'version = 1\n[policy]\nallow = ["{rule}"]\n')


def test_each_question_has_its_own_code():
    codes = iter(["km", "km", "pq"])
    qs = Questions(draw_code=lambda: next(codes))
    _, one = qs.ask(1, "one.example", 443, "http", now=0.0)
    _, two = qs.ask(2, "two.example", 443, "http", now=0.0)
    assert (one.code, two.code) == ("km", "pq")          # drawn again: never two alike
    assert qs.by_code("pq") is two and qs.by_code("zz") is None


def test_deny_holds_for_the_run_and_a_timeout_does_not():
    qs = Questions(timeout=60)
    _, q = qs.ask(1, "a.example", 443, "socks", now=0.0)
    assert [r.allow for _q, rs in qs.answer(q, "deny") for r in rs] == [False]
    reply, again = qs.ask(2, "a.example", 443, "socks", now=1.0)
    assert again is None and not reply.allow and reply.answer == "deny"

    _, q = qs.ask(3, "b.example", 443, "socks", now=0.0)
    assert qs.next_deadline() == 60.0
    assert qs.expire(59.9) == []
    [(expired, replies)] = qs.expire(60.0)
    assert expired is q and [(r.allow, r.by) for r in replies] == [(False, "timeout")]
    # Nobody answered: the next connection asks again.
    reply, again = qs.ask(4, "b.example", 443, "socks", now=61.0)
    assert reply is None and again is not None and again.number != q.number


def test_a_question_nobody_waits_on_closes():
    qs = Questions()
    _, q = qs.ask(("lead", 1), "a.example", 443, "http", now=0.0)
    qs.ask(("worker", 1), "a.example", 443, "http", now=0.0)
    assert qs.forget(lambda token: token[0] == "lead") == []
    assert q.waiting == [("worker", 1)]
    assert qs.forget(lambda token: token[0] == "worker") == [q]
    assert qs.first() is None and qs.answered == {}


def test_an_answer_goes_to_the_oldest_question_and_only_once():
    qs = Questions()
    _, first = qs.ask(1, "one.example", 443, "http", now=0.0)
    _, second = qs.ask(2, "two.example", 443, "http", now=0.0)
    assert qs.first() is first
    assert qs.answer(first, "always")[0][1][0].allow
    assert qs.answer(first, "deny") == []            # already answered: nothing changes
    assert qs.first() is second and qs.find(second.number) is second
    with pytest.raises(ValueError):
        qs.answer(second, "maybe")


def test_rule_for_ipv6_has_brackets():
    assert rule_for("2001:db8::1", 443) == "[2001:db8::1]:443"
    assert rule_for("pypi.org", 443) == "pypi.org:443"
    for host in ("pypi.org", "2001:db8::1", "10.0.0.1"):
        parse_policy(f'version = 1\n[policy]\nallow = ["{rule_for(host, 443)}"]\n')


def test_a_workers_question_is_answered_on_its_own_link(tmp_path):
    """A broker worker's link, handed over the lead's (hold.Hold.for_worker),
    carries its question and its answer; the lead's link carries neither.
    Without a terminal the answer is a denial, said once."""
    lead_broker, lead_orchestrator = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    said = []
    asker = Asker(run_id="r-test", broker_end=lead_orchestrator, policy=None, relay=None,
                  say=said.append, timeout=60, state_dir=str(tmp_path), program="p")
    sel = selectors.DefaultSelector()
    asker.start(sel)

    async def worker_asks():
        hold = Hold.for_worker(os.dup(lead_broker.fileno()))
        asking = [asyncio.ensure_future(hold.ask("new.example", 443, "http")) for _ in range(3)]
        while not all(task.done() for task in asking):
            for key, events in sel.select(0):
                asker.handle(key, events)
            await asyncio.sleep(0.01)
        return [task.result() for task in asking]

    try:
        answers = asyncio.run(worker_asks())
        assert {(a.allow, a.by) for a in answers} == {(False, "no-terminal")}
        assert len(asker.links) == 2
        lead_broker.setblocking(False)
        with pytest.raises(BlockingIOError):
            lead_broker.recv(4096)          # nothing came back on the lead's link
        assert len(said) == 1 and "no terminal to ask on" in said[0]
    finally:
        asker.close()
        sel.close()
        lead_broker.close()


# ---- keys

def test_keys_pass_unchanged_while_nothing_is_asked():
    keys = KeyFilter()
    assert keys.feed(b"ya\x1dyn\x1dd", asking=False) == (b"ya\x1dyn\x1dd", [])


def test_only_the_prefix_the_code_then_a_letter_answers():
    keys = KeyFilter()
    assert keys.feed(b"yes\r", asking=True) == (b"yes\r", [])      # typed for the program
    assert keys.feed(b"ab\x1dkmy", asking=True) == (b"ab", [Typed("km", "port", "once")])
    assert keys.feed(b"\x1dKMA", asking=True) == (b"", [Typed("km", "port", "always")])
    assert keys.feed(b"\x1dkmhr", asking=True) == (b"", [Typed("km", "host", "run")])
    assert keys.feed(b"\x1dkmwd", asking=True) == (b"", [Typed("km", "suffix", "deny-always")])
    assert keys.feed(b"\x1dy", asking=True) == (b"\x1dy", [])      # no code: the program's
    assert keys.feed(b"\x1d\x1d", asking=True) == (b"\x1d", [])    # a literal Ctrl-]
    # Once the code is typed the sequence is vpnw's: a wrong key answers nothing.
    assert keys.feed(b"\x1dkmx", asking=True) == (b"", [Typed("km", "port", None)])
    assert keys.feed(b"\x1dk!", asking=True) == (b"", [Typed("k")])
    # The keys may come in several reads.
    assert keys.feed(b"\x1d", asking=True) == (b"", [])
    assert keys.feed(b"k", asking=True) == (b"", [])
    assert keys.feed(b"mn rest", asking=True) == (b" rest", [Typed("km", "port", "deny")])
    # One answer per read: a second sequence in the same read is the program's.
    assert keys.feed(b"\x1dkmd\x1dkmy", asking=True) == (b"\x1dkmy",
                                                          [Typed("km", "port", "deny-always")])


def test_nothing_pasted_is_an_answer():
    keys = KeyFilter()
    pasted = b"\x1b[200~text \x1dkmy more\x1b[201~"
    assert keys.feed(pasted, asking=True) == (pasted, [])
    # The markers split across reads, the paste started before the question.
    assert keys.feed(b"\x1b[20", asking=False) == (b"\x1b[20", [])
    assert keys.feed(b"0~ab", asking=False) == (b"0~ab", [])
    assert keys.feed(b"\x1dkmy", asking=True) == (b"\x1dkmy", [])
    assert keys.feed(b"\x1b[201~", asking=True) == (b"\x1b[201~", [])
    assert keys.feed(b"\x1dkmy", asking=True) == (b"", [Typed("km", "port", "once")])


def test_a_held_prefix_is_given_back_when_the_question_closed_meanwhile():
    keys = KeyFilter()
    assert keys.feed(b"\x1d", asking=True) == (b"", [])
    assert keys.feed(b"y", asking=False) == (b"\x1dy", [])


def test_a_drawn_question_gets_no_answer_from_the_asker(tmp_path):
    """The asker answers a sequence only with an open question's code: keys
    typed for a question the program drew (another code) answer nothing."""
    lead_broker, lead_orchestrator = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    said = []
    asker = Asker(run_id="r-test", broker_end=lead_orchestrator, policy=None, relay=None,
                  say=said.append, timeout=60, state_dir=str(tmp_path), program="p")
    try:
        _, question = asker.questions.ask(("link", 1), "evil.example", 80, "http", now=0.0)
        wrong = "bc" if question.code != "bc" else "cb"
        asker._typed(Typed(wrong, "port", "once"))
        assert asker.questions.by_code(question.code) is question     # still open
        assert "no open question of vpnw's has the code" in said[-1]
    finally:
        asker.close()
        lead_broker.close()


# ---- the terminal

def test_mid_escape():
    assert not mid_escape(b"plain text")
    assert mid_escape(b"abc\x1b")
    assert mid_escape(b"abc\x1b[3")
    assert not mid_escape(b"abc\x1b[31m")
    assert mid_escape(b"\x1b]2;half a title")
    assert not mid_escape(b"\x1b]2;a title\x07more")
    assert not mid_escape(b"\x1b]2;a title\x1b\\")


def test_title_has_no_control_characters_of_its_own():
    assert title("a\x07b\x1b]c") == b"\x1b]2;a b ]c\x07"


# ---- the policy file

POLICY = """\
# the team's agent policy
version = 1
name = "agent"

[policy]
default = "deny"   # nothing unless listed
allow = [
    "api.github.com",     # the API
    "*.pythonhosted.org",
]
"""


def test_a_rule_is_added_with_its_comment_and_everything_else_kept():
    text = with_rule(POLICY, "allow", "pypi.org:443", "added by vpnw guard --ask on 2026-12-01, run r-1")
    assert text.startswith(POLICY.split("]\n")[0])   # all before the array's end unchanged
    assert '"pypi.org:443", # added by vpnw guard --ask on 2026-12-01, run r-1' in text
    assert "# the team's agent policy" in text and 'default = "deny"   # nothing unless listed' in text
    policy = parse_policy(text)
    assert [r.text for r in policy.allow] == ["api.github.com", "*.pythonhosted.org", "pypi.org:443"]
    assert with_rule(text, "allow", "pypi.org:443", "again") == text      # already there
    denied = parse_policy(with_rule(POLICY, "deny", "evil.example:443", "c"))
    assert [r.text for r in denied.deny] == ["evil.example:443"]
    assert [r.text for r in denied.allow] == ["api.github.com", "*.pythonhosted.org"]


def test_add_rule_writes_in_place_and_refuses_a_changed_file(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text(POLICY)
    path.chmod(0o640)
    inode = path.stat().st_ino
    sha = text_sha256(POLICY)
    new_sha = _add_rule(path, "allow", "pypi.org:443", expected_sha256=sha, run_id="r-1",
                        today="2026-12-01")
    assert new_sha == text_sha256(path.read_bytes())
    assert '"pypi.org:443", # added by vpnw guard --ask' in path.read_text()
    assert oct(path.stat().st_mode & 0o777) == "0o640"
    assert path.stat().st_ino == inode                                 # the same file
    assert [p.name for p in tmp_path.iterdir()] == ["agent.toml"]       # no other name, ever
    # The same run's next answer compares against its own write.
    _add_rule(path, "deny", "evil.example:443", expected_sha256=new_sha, run_id="r-1",
              today="2026-12-01")
    # Someone edits the file: the run's hash no longer matches.
    edited = path.read_text() + "# a person's edit\n"
    path.write_text(edited)
    with pytest.raises(EditRefused, match="changed since this run read it"):
        _add_rule(path, "allow", "x.example:443", expected_sha256=new_sha, run_id="r-1",
                  today="2026-12-01")
    assert path.read_text() == edited


def test_add_rule_follows_the_place_taken_at_the_start(tmp_path):
    """The file's directory as opened before the program started: a
    directory moved aside and another made at its name, or the file
    replaced by a copy, are not written."""
    work = tmp_path / "work"
    work.mkdir()
    path = work / "agent.toml"
    path.write_text(POLICY)
    place = open_place(str(path))
    try:
        work.rename(tmp_path / "aside")
        work.mkdir()
        (work / "agent.toml").write_text(POLICY)
        add_rule(place, "allow", "pypi.org:443", expected_sha256=text_sha256(POLICY),
                 run_id="r-1", today="2026-12-01")
        assert "pypi.org:443" in (tmp_path / "aside" / "agent.toml").read_text()
        assert (work / "agent.toml").read_text() == POLICY
        # The file itself replaced (another inode, the same text): refused.
        moved = tmp_path / "aside" / "agent.toml"
        text = moved.read_text()
        (tmp_path / "aside" / "copy").write_text(text)
        (tmp_path / "aside" / "copy").rename(moved)
        with pytest.raises(EditRefused, match="no longer the file this run read"):
            add_rule(place, "allow", "x.example:443", expected_sha256=text_sha256(text),
                     run_id="r-1", today="2026-12-01")
        # A link put at its name is never followed.
        moved.unlink()
        moved.symlink_to(work / "agent.toml")
        with pytest.raises(EditRefused, match="cannot open it"):
            add_rule(place, "allow", "x.example:443", expected_sha256=text_sha256(POLICY),
                     run_id="r-1", today="2026-12-01")
        assert (work / "agent.toml").read_text() == POLICY
    finally:
        place.close()


def test_policy_sha256_and_ask_key():
    policy = parse_policy(POLICY.replace('default = "deny"', 'default = "deny"\nask = true'))
    assert policy.ask is True
    assert parse_policy(POLICY).ask is False
    assert parse_policy(POLICY).sha256 == text_sha256(POLICY)
    with pytest.raises(Exception, match="ask is a string"):
        parse_policy(POLICY.replace('default = "deny"', 'ask = "yes"'))


def test_add_rule_refuses_what_would_not_be_a_policy(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(POLICY)
    with pytest.raises(EditRefused, match="not be a valid policy"):
        _add_rule(path, "allow", "*", expected_sha256=text_sha256(POLICY), run_id="r-1",
                  today="2026-12-01")
    assert path.read_text() == POLICY
    assert os.listdir(tmp_path) == ["p.toml"]


def test_vpnw_ask_removes_a_socket_nobody_listens_on(tmp_path, monkeypatch):
    """A run that was killed leaves its socket; `vpnw ask` lists nothing for
    it and removes it."""
    from stages.orchestrator import ask_command
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    directory = tmp_path / "vpnw" / "ask"
    directory.mkdir(parents=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(str(directory / "r-dead.sock"))
    dead.close()
    assert ask_command._runs() == []
    assert os.listdir(directory) == []


# ---- what a question warns about

def test_risks_name_private_addresses_special_names_and_new_names(tmp_path):
    from stages.orchestrator.risks import SeenNames, of
    assert of("10.0.0.5", None)[0].startswith("not a public address: 10.0.0.5")
    assert of("169.254.169.254", None)[0].startswith("not a public address: 169.254.169.254")
    assert of("metadata.google.internal", None)[0].startswith("not a public name")
    assert of("140.82.112.3", None) == ()
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "r-old.jsonl").write_bytes(b'{"type":"conn.request","fields":{"host":"pypi.org"}}\n')
    (runs / "r-now.jsonl").write_bytes(b'{"type":"conn.request","fields":{"host":"new.example"}}\n')
    seen = SeenNames(str(runs), "r-now")
    assert of("pypi.org", seen) == ()
    assert of("new.example", seen) == ("new: not seen in your last 1 runs",)   # not this run's
    assert of("new.example", SeenNames(str(tmp_path / "none"), "r-now")) == ()  # nothing to compare


# ---- vpnw's lines on the terminal

def test_vpnw_lines_start_readable_and_the_modes_go_back():
    from stages.orchestrator.line_merger import READABLE, LineMerger
    from stages.orchestrator.user_terminal import MODES_BACK
    m = LineMerger(line_start=READABLE)
    m.program_output(b"\x1b[8mconcealed\r\n", 0.0)
    assert m.human_line(b"vpnw: 1 denied", 0.0) == b"\x1b[0m\x0f\x1b(Bvpnw: 1 denied\r\n"
    for mode in (b"\x1b[4l", b"\x1b[?7h", b"\x1b[?1l", b"\x1b>", b"\x1b[0m", b"\x1b]110\x07",
                 b"\x1b]111\x07"):
        assert mode in MODES_BACK
    assert MODES_BACK.startswith(b"\x18")       # ends a sequence the program left unfinished


def test_title_reports_are_never_asked_of_the_terminal_under_ask():
    """The title holds the code: `CSI 21 t` (and 20, the icon label) would
    make the terminal type it to the program. Whole or split byte by byte;
    other sequences, 22/23 t (the title stack) included, pass unchanged."""
    from stages.orchestrator.escapes import TitleReportFilter
    for asked in (b"\x1b[21t", b"\x1b[20t", b"\x1b[021t", b"\x1b[21;0t"):
        data = b"a" + asked + b"b\x1b[22;0tc\x1b[31md\x1b]2;x\x07"
        kept = b"ab\x1b[22;0tc\x1b[31md\x1b]2;x\x07"
        assert TitleReportFilter().feed(data) == kept, asked
        f = TitleReportFilter()
        assert b"".join(f.feed(data[i:i + 1]) for i in range(len(data))) + f.finish() == kept
    assert TitleReportFilter().feed(b"\x1b[?21t\x1b[8;24;80t") == b"\x1b[?21t\x1b[8;24;80t"
    # A C0 control inside the sequence goes out; the request is still dropped.
    assert TitleReportFilter().feed(b"\x1b[2\n1t") == b"\n"

"""guard --ask's pure parts: the questions (one per destination, answers that
hold for the run, timeouts), the answer keys (only Ctrl-] then a letter,
only while a question is open), where a title may be written, and the
policy file written back (tomlkit: comments and layout kept; atomic;
refused when the file changed)."""
from __future__ import annotations

import asyncio
import os
import selectors
import socket

import pytest

from stages.broker.hold import Hold
from stages.orchestrator.asker import Asker

from stages.config.policy import parse_policy
from stages.config.policy_edit import EditRefused, add_rule, text_sha256, with_rule
from stages.orchestrator.ask import KeyFilter, Questions, mid_escape, rule_for, title


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
    replies = qs.answer(new[0], "once")
    assert sorted(r.token for r in replies) == list(range(20))
    assert all(r.allow and r.by == "person" and r.answer == "once" for r in replies)
    # Later connections to it in the same run: answered at once, no question.
    reply, question = qs.ask(99, "new.example", 443, "http", now=1.0)
    assert question is None and reply.allow and reply.token == 99
    # Another port is another destination.
    assert qs.ask(100, "new.example", 80, "http", now=1.0)[1] is not None


def test_deny_holds_for_the_run_and_a_timeout_does_not():
    qs = Questions(timeout=60)
    _, q = qs.ask(1, "a.example", 443, "socks", now=0.0)
    assert [r.allow for r in qs.answer(q, "deny")] == [False]
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
    assert qs.answer(first, "always")[0].allow
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


def test_only_the_prefix_then_a_letter_answers():
    keys = KeyFilter()
    assert keys.feed(b"yes\r", asking=True) == (b"yes\r", [])      # typed for the program
    assert keys.feed(b"ab\x1dy", asking=True) == (b"ab", ["once"])
    assert keys.feed(b"\x1dA", asking=True) == (b"", ["always"])
    assert keys.feed(b"\x1dx", asking=True) == (b"\x1dx", [])      # not an answer: passes on
    assert keys.feed(b"\x1d\x1d", asking=True) == (b"\x1d", [])    # a literal Ctrl-]
    # The prefix and its letter may come in two reads.
    assert keys.feed(b"\x1d", asking=True) == (b"", [])
    assert keys.feed(b"n rest", asking=True) == (b" rest", ["deny"])
    # One answer per read: a second sequence in the same read is the program's.
    assert keys.feed(b"\x1dd\x1dy", asking=True) == (b"\x1dy", ["deny-always"])


def test_nothing_pasted_is_an_answer():
    keys = KeyFilter()
    pasted = b"\x1b[200~text \x1dy more\x1b[201~"
    assert keys.feed(pasted, asking=True) == (pasted, [])
    # The markers split across reads, the paste started before the question.
    assert keys.feed(b"\x1b[20", asking=False) == (b"\x1b[20", [])
    assert keys.feed(b"0~ab", asking=False) == (b"0~ab", [])
    assert keys.feed(b"\x1dy", asking=True) == (b"\x1dy", [])
    assert keys.feed(b"\x1b[201~", asking=True) == (b"\x1b[201~", [])
    assert keys.feed(b"\x1dy", asking=True) == (b"", ["once"])        # typed, after the paste


def test_a_held_prefix_is_given_back_when_the_question_closed_meanwhile():
    keys = KeyFilter()
    assert keys.feed(b"\x1d", asking=True) == (b"", [])
    assert keys.feed(b"y", asking=False) == (b"\x1dy", [])


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


def test_add_rule_writes_atomically_and_refuses_a_changed_file(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text(POLICY)
    path.chmod(0o640)
    sha = text_sha256(POLICY)
    new_sha = add_rule(str(path), "allow", "pypi.org:443", expected_sha256=sha, run_id="r-1",
                       today="2026-12-01")
    assert new_sha == text_sha256(path.read_bytes())
    assert oct(path.stat().st_mode & 0o777) == "0o640"
    assert [p.name for p in tmp_path.iterdir()] == ["agent.toml"]       # no temporary left
    # The same run's next answer compares against its own write.
    add_rule(str(path), "deny", "evil.example:443", expected_sha256=new_sha, run_id="r-1",
             today="2026-12-01")
    # Someone edits the file: the run's hash no longer matches.
    edited = path.read_text() + "# a person's edit\n"
    path.write_text(edited)
    with pytest.raises(EditRefused, match="changed since this run read it"):
        add_rule(str(path), "allow", "x.example:443", expected_sha256=new_sha, run_id="r-1",
                 today="2026-12-01")
    assert path.read_text() == edited


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
        add_rule(str(path), "allow", "*", expected_sha256=text_sha256(POLICY), run_id="r-1",
                 today="2026-12-01")
    assert path.read_text() == POLICY
    assert os.listdir(tmp_path) == ["p.toml"]


def test_a_write_that_fails_half_way_leaves_the_old_file(tmp_path, monkeypatch):
    """The rename is the one step that replaces the file: when it fails (a
    crash before it), the old file is whole and no temporary stays."""
    path = tmp_path / "agent.toml"
    path.write_text(POLICY)

    def crash(src, dst):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(EditRefused, match="cannot write it"):
        add_rule(str(path), "allow", "pypi.org:443", expected_sha256=text_sha256(POLICY),
                 run_id="r-1", today="2026-12-01")
    assert path.read_text() == POLICY
    assert os.listdir(tmp_path) == ["agent.toml"]


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

"""`vpnw guard --ask` on a real terminal (tmux), as root and as the unprivileged user.

A connection no rule allows waits while the person is asked on vpnw's own
terminal; the answer keys are Ctrl-] then a letter. What each test proves:
- the answers (Ctrl-], the question's code, a letter): now (the next run
  asks again), always (the policy file
  gains the rule with its comment; the next run does not ask), deny, deny
  always, and no answer (a timeout); the world's DNS log shows no look-up of
  the name before the person allowed it, and the record names the answer;
- the program cannot answer for the person: it prints a fake question and
  types the answer keys into its own terminal (its output, and TIOCSTI on
  its own pty): denied when the time is up. 20 connections to one new host
  are one question, and all 20 get its answer. A policy file edited during
  the run is not overwritten;
- a full-screen program: nothing is drawn over its picture while a
  question is open (the question is in the pane's title); `vpnw ask` in a
  second terminal lists it and answers it; the picture is the same as the
  same program's outside vpnw (the control). Without a terminal --ask
  denies at once, says so once, and exits 120.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_support import wait_until
from progs_support import prog_text
from stages.record.check import check_run
from tmux_support import PROMPT, Screen

pytestmark = pytest.mark.world

SYSTEM_PYTHON = "/usr/bin/python3"
HOST = "pypi.world"
QUESTION = rf"vpnw: asks [a-z]{{2}}: {re.escape(HOST)}:80 \(http door\) is not in the policy"

FETCH = prog_text("ask_fetch.py")

# A program that asks in a thread and meanwhile tries to answer for the
# person ("fake") or to reach `vpnw ask`'s socket from inside ("sneak").
MEANWHILE = prog_text("ask_meanwhile.py")

# A full-screen program: a picture on the alternate screen, a connection,
# its result drawn in place, then it waits for "q".
FULL = prog_text("ask_full.py")


def _pane(world, user, tmpdir: Path, work: Path, state_home=None):
    argv, state_home = world.command(["bash", "--norc", "--noprofile", "-i"], user=user,
                                     env={"TERM": "screen", "PS1": PROMPT}, cwd=work,
                                     state_home=state_home)
    screen = Screen(tmpdir, argv)
    screen.state_home = state_home
    screen.wait_for(r"^\$ ")
    return screen


@pytest.fixture
def term(world, user, tmp_path):
    tmp_path.chmod(0o755)
    work = world.workdir(user)
    screen = _pane(world, user, tmp_path, work)
    screen.work, screen.vpnw, screen.user = work, str(world.vpnw_path), user
    try:
        yield screen
    finally:
        screen.close()


def policy(world, term, body: str = 'allow = ["api.github.com"]\n') -> Path:
    """A policy file of the pane's user, in a directory the user may write."""
    path = term.work / "agent.toml"
    path.write_text(f'# the agent\'s policy\nversion = 1\n\n[policy]\ndefault = "deny"  # keep\n{body}')
    subprocess.run(["chown", term.user, str(path)], check=True)
    return path


def program(world, term, name: str, text: str) -> str:
    return str(world.file(f"{term.work.name}-{name}", text))


def records(term) -> list[list[dict]]:
    out = []
    for path in sorted((term.state_home / "vpnw" / "runs").glob("*.jsonl"),
                       key=lambda p: p.stat().st_mtime_ns):
        events = [json.loads(line) for line in path.read_text().splitlines()]
        assert check_run(events) == [], check_run(events)
        out.append(events)
    return out


def decisions(events) -> list[tuple]:
    return [(e["type"], e["fields"]["rule"], e["fields"].get("by"), e["fields"].get("answer"))
            for e in events if e["type"] in ("policy.allow", "policy.deny")]


def guard(term, path: Path, prog: str, *args: str, extra: str = "", env: str = "") -> int:
    return term.start(f"{env}{term.vpnw} guard --ask {extra}--policy {path} -- "
                      f"{SYSTEM_PYTHON} {prog} {' '.join(args)}")


def questions_shown(term) -> int:
    return len(re.findall(QUESTION, term.history()))


def answer(term, destination: str, letters: str) -> str:
    """The person answers vpnw's newest question about `destination` (a
    regex): Ctrl-], the code the question shows, then `letters`."""
    found = re.findall(rf"vpnw: asks ([a-z]{{2}}): {destination} ", term.history())
    assert found, term.history()[-3000:]
    term.keys("C-]")
    term.type(found[-1] + letters)
    return found[-1]


def test_once_always_deny_deny_always_and_a_timeout(world, term):
    path = policy(world, term)
    fetch = program(world, term, "fetch.py", FETCH)
    url = f"http://{HOST}/whoami"

    # once: nothing looked up before the answer; allowed; the next run asks again
    since = world.dns_mark()
    mark = guard(term, path, fetch, url)
    term.wait_for(QUESTION, whole=True)
    assert HOST not in " ".join(world.dns_queries(since)), "looked up before the person allowed it"
    answer(term, r"pypi\.world:80", "y")
    assert term.finished(mark) == 0
    term.wait_for(r"^fetched 1 of 1", whole=True)
    assert HOST in " ".join(world.dns_queries(since))
    assert ("policy.allow", "asked", "person", "once") in decisions(records(term)[-1])

    # deny: the next run asks again (once held for that run only), 120
    shown = questions_shown(term)
    mark = guard(term, path, fetch, url)
    term.wait_for(QUESTION, whole=True)
    wait_until(lambda: questions_shown(term) == shown + 1, 60)
    answer(term, r"pypi\.world:80", "n")
    assert term.finished(mark) == 120
    assert ("policy.deny", "asked", "person", "deny") in decisions(records(term)[-1])

    # always: the policy gains the rule with its comment; the next run does not ask
    before = path.read_text()
    mark = guard(term, path, fetch, url)
    wait_until(lambda: questions_shown(term) == shown + 2, 60)
    answer(term, r"pypi\.world:80", "a")
    assert term.finished(mark) == 0
    after = path.read_text()
    run_id = records(term)[-1][0]["run"]
    assert re.search(rf'"{HOST}:80", # added by vpnw guard --ask on \d{{4}}-\d\d-\d\d, run {run_id}',
                     after), after
    assert after.startswith(before.split("]")[0])       # comments and layout kept
    assert "default = \"deny\"  # keep" in after
    mark = guard(term, path, fetch, url)
    assert term.finished(mark) == 0
    assert questions_shown(term) == shown + 2
    assert decisions(records(term)[-1])[0][1].startswith(f'allow "{HOST}:80"')

    # deny always: a deny rule; the next run is denied by it without a question
    other = "http://git.world/whoami"
    mark = guard(term, path, fetch, other)
    term.wait_for(r"vpnw: asks [a-z]{2}: git\.world:80", whole=True)
    answer(term, r"git\.world:80", "d")
    assert term.finished(mark) == 120
    assert '"git.world:80", # added by vpnw guard --ask' in path.read_text()
    mark = guard(term, path, fetch, other)
    assert term.finished(mark) == 120
    assert decisions(records(term)[-1])[0][1].startswith('deny "git.world:80"')

    # no answer in time: denied, by the timeout
    mark = guard(term, path, fetch, "http://dual.world/whoami", extra="--ask-timeout 2 ")
    term.wait_for(r"vpnw: asks [a-z]{2}: dual\.world:80", whole=True)
    assert term.finished(mark) == 120
    term.wait_for(r"dual\.world:80: no answer within 2 s; denied", whole=True)
    assert ("policy.deny", "asked", "timeout", "deny") in decisions(records(term)[-1])


def test_the_program_cannot_answer_one_question_for_twenty_and_an_edited_policy(world, term):
    path = policy(world, term)
    meanwhile = program(world, term, "meanwhile.py", MEANWHILE)
    fetch = program(world, term, "fetch.py", FETCH)

    # The program's fake question and keys: never an answer; the timeout denies.
    mark = guard(term, path, meanwhile, "fake", extra="--ask-timeout 4 ")
    term.wait_for(r"fake: injected \d", whole=True)
    assert term.finished(mark) == 120
    term.wait_for(r"^fake: refused 403", whole=True)
    assert [d[2] for d in decisions(records(term)[-1])] == ["timeout"]

    # Nor through `vpnw ask`'s socket: closed unanswered (ECONNRESET, EPIPE or
    # EOF: the peer is in the sandbox's network namespace), or unreachable
    # (EPERM, ENOENT, EACCES, ECONNREFUSED). The control is `vpnw ask` from a
    # second terminal, which is answered (test_full_screen_...).
    mark = guard(term, path, meanwhile, "sneak", str(term.state_home / "vpnw" / "ask"),
                 extra="--allow-unix-sockets --ask-timeout 4 ")
    assert term.finished(mark) == 120
    shown_text = term.history()
    answered = re.findall(r"^sneak: (answered|error) (.*)$", shown_text, re.M)
    assert answered, shown_text
    for kind, detail in answered:
        assert (kind, detail) == ("answered", "b''") or (kind == "error" and detail in
                                                          ("1", "2", "13", "32", "104", "111")), answered
    term.wait_for(r"^sneak: refused 403", whole=True)
    assert [d[2] for d in decisions(records(term)[-1])] == ["timeout"]

    # 20 connections to one new host: one question, 20 answers, also when
    # broker workers take some of them (each asks the one place).
    shown = questions_shown(term)
    mark = guard(term, path, fetch, *[f"http://{HOST}/whoami?n={i}" for i in range(20)],
                 env="VPNW_BROKER_WORKERS=4 ")
    wait_until(lambda: questions_shown(term) == shown + 1, 60)
    time.sleep(1.0)                 # the other 19 have asked by now, and are waiting
    assert questions_shown(term) == shown + 1
    answer(term, r"pypi\.world:80", "y")
    assert term.finished(mark) == 0
    term.wait_for(r"^fetched 20 of 20", whole=True)
    assert questions_shown(term) == shown + 1
    allowed = decisions(records(term)[-1])
    assert allowed == [("policy.allow", "asked", "person", "once")] * 20
    # (Four processes wait on the door at once; which takes which connection
    # is the kernel's choice: in most trial runs three or four of them took
    # some. test_ask.py checks that a worker's questions and answers go over
    # its own link.)

    # The policy file edited while a question is open: "always" does not overwrite it.
    mark = guard(term, path, fetch, f"http://{HOST}/whoami")
    wait_until(lambda: questions_shown(term) == shown + 2, 60)
    edited = path.read_text() + "# a person's edit during the run\n"
    path.write_text(edited)
    answer(term, r"pypi\.world:80", "a")
    assert term.finished(mark) == 0        # allowed, for this run only
    term.wait_for(r"agent\.toml not changed: the file changed since this run read it", whole=True)
    assert path.read_text() == edited


def test_full_screen_program_vpnw_ask_and_no_terminal(world, term, user, tmp_path):
    path = policy(world, term)
    full = program(world, term, "full.py", FULL)

    # The control: the same program outside vpnw (the world's network is direct).
    mark = term.start(f"{SYSTEM_PYTHON} {full}")
    term.wait_for(r"^status 200; q quits")
    control = term.screen()
    term.keys("q")
    assert term.finished(mark) == 0

    mark = guard(term, path, full)
    term.wait_for(r"FULL SCREEN PICTURE row 10")
    wait_until(lambda: re.search(r"vpnw asks [a-z]{2}: allow pypi\.world:80\?", _title(term)), 60)
    picture = term.screen()
    assert "vpnw" not in picture, picture
    # A second terminal of the same user: `vpnw ask` lists the question and answers it.
    (tmp_path / "second").mkdir(mode=0o755)
    second = _pane(world, user, tmp_path / "second", term.work, state_home=term.state_home)
    try:
        assert second.run(f"{term.vpnw} ask --list") == 0
        second.wait_for(r"r-\S+ \(python3, pid \d+\) #1: pypi\.world:80 by the http door; "
                        r'rule "pypi\.world:80"; 1 connection waiting', whole=True)
        # `vpnw ask` on a terminal asks about each open question in turn.
        mark2 = second.start(f"{term.vpnw} ask")
        second.wait_for(r"y now · r this run · a always · n deny · d deny always "
                        r"\(h first: any port\) · Enter skips: $")
        second.line("y")
        assert second.finished(mark2) == 0
        second.wait_for(r"vpnw: pypi\.world:80: allowed now", whole=True)
    finally:
        second.close()
    term.wait_for(r"^status 200; q quits")
    assert term.screen() == control          # the picture intact, as outside vpnw
    wait_until(lambda: "vpnw asks" not in _title(term), 60)
    term.keys("q")
    assert term.finished(mark) == 0
    term.wait_for(r"vpnw: pypi\.world:80: allowed now", whole=True)   # after the full screen
    assert ("policy.allow", "asked", "person", "once") in decisions(records(term)[-1])

    assert records(term)[-1][0]["fields"]["ask"] is True
    # No terminal (a pipe): denied as guard does, said once, 120; asking
    # turned on by the policy (ask = true) this time.
    fetch = program(world, term, "fetch.py", FETCH)
    path = policy(world, term, 'ask = true\nallow = ["api.github.com"]\n')
    r = world.vpnw(["guard", "--policy", str(path), "--", SYSTEM_PYTHON, fetch,
                    f"http://{HOST}/whoami", "http://git.world/whoami"], user=user, timeout=120)
    assert r.returncode == 120, r.stderr
    assert "fetched 0 of 2" in r.stdout
    assert r.stderr.count("--ask: vpnw has no terminal to ask on") == 1, r.stderr
    assert r.stderr.count("DENY") == 2, r.stderr


def _title(term) -> str:
    return term._tmux("display-message", "-p", "-t", "t", "#{pane_title}")

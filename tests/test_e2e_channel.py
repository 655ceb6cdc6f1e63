"""The person's channel under attack (issue 42, finding 4) and `--ask`'s
scopes (issue 44), on a real terminal (tmux), as root and as vpnwtest.

- The write-back race: a program that can write the policy's directory
  (the README's own workflow keeps the policy in ".") watches it with
  inotify and renames a `default = "allow"` policy over every name that
  appears there, then writes the policy file itself. The person answers
  "always": no name ever appears in that directory, the file gains the
  person's rule and nothing else, and the program's own write is refused
  (the read-only bind still covers the file). The control: outside vpnw the
  same program swaps a temporary file made beside the policy, and writes
  the policy.
- The edited question: the program rewrites vpnw's question line in place,
  keeping vpnw's code and changing the host: while a question is open on
  the normal screen the program's output waits, so the person reads the
  question vpnw drew.
- The spoofed question: the program draws copies of a question for
  pypi.world, in the old form ("Ctrl-] then y") and in the new one with a
  code of its own guess, then asks for evil.example. The person types the
  keys each drawn question shows: evil.example is never allowed (denied
  when the time is up) and vpnw says the code is none of its own. (Erasing
  vpnw's question once it is open and drawing the copy then is the edited
  question's case: the program's output waits while it is open.)
- The concealed lines: a program erases the screen (vpnw's DENY line with
  it) and leaves SGR 8 ("conceal"), insert mode, autowrap off, application
  cursor keys and keypad set as it exits. vpnw's summary ("1 denied") and
  what the person types next are drawn unconcealed, and the pane's modes
  are back (tmux's own flags). The control: the same program outside vpnw
  leaves all of them set.
- The scopes: now (the next connection asks again), this run, always
  (written back), for the host and port, the host (any port) and a suffix.
- The risk notes: a name never seen in the user's runs, an address that is
  not public; a name seen before has none.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from e2e_support import wait_until
from progs_support import prog_text
from test_e2e_ask import SYSTEM_PYTHON, decisions, records

pytestmark = pytest.mark.world


def policy(term, user: str, body: str = 'allow = ["api.github.com"]\n') -> Path:
    import subprocess
    path = term.work / "agent.toml"
    path.write_text(f"# the agent's policy\nversion = 1\n\n[policy]\ndefault = \"deny\"\n{body}")
    subprocess.run(["chown", user, str(path)], check=True)
    return path


def program(world, term, name: str, text: str) -> str:
    return str(world.file(f"{term.work.name}-{name}", text))


def guard(term, path: Path, prog: str, *args: str, extra: str = "") -> int:
    return term.start(f"{term.vpnw} guard --ask {extra}--policy {path} -- "
                      f"{SYSTEM_PYTHON} {prog} {' '.join(args)}")


def code_of(term, destination: str, nth: int = 1) -> str:
    """The code of the nth question of vpnw's about `destination` (a regex);
    "" from a vpnw whose questions had none (so that these tests show what
    the older vpnw let through, not only that its question looked different)."""
    one = rf"vpnw: asks(?: [a-z]{{2}})?: {destination} "
    term.wait_for(rf"(?s)(?:{one}.*?){{{nth - 1}}}{one}", whole=True)
    return re.findall(rf"vpnw: asks(?: ([a-z]{{2}}))?: {destination} ", term.history())[nth - 1]


def press(term, code: str, letters: str) -> None:
    term.keys("C-]")
    term.type(code + letters)


def scopes(events) -> list[tuple]:
    return [(e["fields"].get("answer"), e["fields"].get("scope"), e["fields"]["host"],
             e["fields"]["port"]) for e in events if e["type"] in ("policy.allow", "policy.deny")
            and e["fields"]["rule"] == "asked"]


# ---- the write-back race

# Watches "." (the policy's directory) and renames a permissive policy over
# every name that appears there, while the person is asked; then writes
# the policy itself. argv: flag file that ends the watch, then a URL to
# fetch (none: the control, outside).
SWAP = prog_text("channel_swap.py")


def test_the_write_back_passes_through_no_name_the_program_can_swap(world, user, term):
    swap = program(world, term, "swap.py", SWAP)
    stop = term.work / "stop-watching"

    # The control: outside vpnw, a temporary file made beside the policy
    # (as a write-back through a rename makes it) is swapped, and the
    # policy is written.
    path = policy(term, user)
    mark = term.start(f"{SYSTEM_PYTHON} {swap} {stop}")
    term.wait_for(r"^swap: watching")
    temp = term.work / ".vpnw-control.toml"
    temp.write_text(path.read_text())
    wait_until(lambda: 'default = "allow"' in temp.read_text(), 60)
    stop.touch()
    assert term.finished(mark) == 0
    term.wait_for(r"^direct: written", whole=True)
    term.wait_for(r"^swap: saw \['\.vpnw-control\.toml'\] swapped \['\.vpnw-control\.toml'\]",
                  whole=True)
    temp.unlink()
    stop.unlink()

    path = policy(term, user)
    before = path.read_text()
    inode = path.stat().st_ino
    mark = guard(term, path, swap, str(stop), "http://pypi.world/whoami")
    press(term, code_of(term, r"pypi\.world:80"), "a")
    term.wait_for(r'"pypi\.world:80" added to allow in \S*agent\.toml', whole=True)
    term.wait_for(r"^swap: fetched 200", whole=True)
    time.sleep(0.5)                  # the watch goes on a little after the write
    stop.touch()
    assert term.finished(mark) == 0
    shown = term.history()
    assert re.search(r"^swap: saw \[\] swapped \[\]", shown, re.M), shown[-3000:]
    # The program's own write to the policy: refused, the file still bound
    # read-only inside (EROFS; EACCES where the file is not the user's).
    assert re.search(r"^direct: error (30|13)$", shown, re.M), shown[-3000:]
    after = path.read_text()
    assert 'default = "allow"' not in after and "the program was here" not in after
    assert after.startswith(before.split("allow = [")[0])
    assert re.search(r'"pypi\.world:80", # added by vpnw guard --ask', after), after
    assert path.stat().st_ino == inode
    assert sorted(p.name for p in term.work.iterdir() if p.name.startswith(".vpnw")) == []


# ---- the spoofed question

# Draws two copies of a question of vpnw's for pypi.world, the old form and
# the new one with a code of its own guess (argv), then asks for
# evil.example: vpnw's own question for it opens below them.
SPOOF = prog_text("channel_spoof.py")


def test_a_question_the_program_draws_obtains_no_approval(world, user, term):
    path = policy(term, user)
    spoof = program(world, term, "spoof.py", SPOOF)
    for guess in ("bc", "fg", "kz"):
        asked = len(re.findall(r"vpnw: asks(?: [a-z]{2})?: evil\.example:80 ", term.history()))
        mark = guard(term, path, spoof, guess, extra="--ask-timeout 8 ")
        term.wait_for(rf"^vpnw: asks {guess}: pypi\.world:80")
        real = code_of(term, r"evil\.example:80", asked + 1)
        if real != guess:
            break
        # The program guessed vpnw's code (once in 256): the person, who has
        # not answered yet, denies, and the program tries again.
        press(term, real, "n")
        assert term.finished(mark) == 120
    # The person types what each drawn question says.
    term.keys("C-]")
    term.type("y")
    term.keys("C-]")
    term.type(f"{guess}y")
    assert term.finished(mark) == 120
    term.wait_for(r"spoof: evil refused 403", whole=True)
    term.wait_for(rf"Ctrl-\] {guess[0]} {guess[1]}: no open question of vpnw's has the code",
                  whole=True)
    assert decisions(records(term)[-1]) == [("policy.deny", "asked", "timeout", "deny")]
    assert "evil.example" not in path.read_text()


# Clears the screen, writes one line (vpnw's question then comes on row 2),
# asks for evil.example in a thread and, once the question is up, rewrites
# row 2 from column 16 on: vpnw's code (columns 12-13) stays, the host and
# the rest become pypi.world's. argv: the file it touches once it has written.
EDIT = prog_text("channel_edit.py")


def test_the_program_cannot_edit_the_question_while_it_is_open(world, user, term):
    path = policy(term, user)
    edit = program(world, term, "edit.py", EDIT)
    edited = term.work / "edited"
    mark = guard(term, path, edit, str(edited))
    code = code_of(term, r"evil\.example:80")
    wait_until(edited.exists, 60)
    time.sleep(1.0)                 # what the program wrote would be on the screen by now
    row = next(line for line in term.screen().splitlines() if f"asks {code}:" in line
               or line.startswith("vpnw: asks"))
    # The person answers what the question on the screen says: allow pypi.world, deny
    # anything else.
    press(term, code, "y" if "pypi.world" in row else "n")
    assert "evil.example:80" in row and "(edited)" not in row, row
    assert term.finished(mark) == 120
    term.wait_for(r"edit: evil refused 403", whole=True)
    term.wait_for(r"\(edited\)", whole=True)         # its output waited; nothing was lost
    assert decisions(records(term)[-1]) == [("policy.deny", "asked", "person", "deny")]


# ---- lines the program would hide, modes it leaves set

# Asked for a denied host; once vpnw's DENY line is drawn, erases the
# screen and exits leaving conceal, insert mode, autowrap off, application
# cursor keys and keypad set. argv: the file whose existence says the DENY
# line is on the screen (the control: no fetch, no wait).
CONCEAL = prog_text("channel_conceal.py")

_SGR = re.compile(r"\x1b\[([0-9;:]*)m")


def concealed_at(text: str, needle: str) -> bool:
    """Whether `needle`, in a capture-pane -e text, is drawn concealed
    (SGR 8 in force where it starts)."""
    at = text.rfind(needle)
    assert at >= 0, text[-3000:]
    concealed = False
    for match in _SGR.finditer(text, 0, at):
        for param in (match.group(1) or "0").replace(":", ";").split(";"):
            if param in ("", "0"):
                concealed = False
            elif param == "8":
                concealed = True
            elif param == "28":
                concealed = False
    return concealed


def modes(term) -> dict:
    names = ("insert_flag", "wrap_flag", "keypad_cursor_flag", "keypad_flag")
    shown = term._tmux("display-message", "-p", "-t", "t", " ".join(f"#{{{n}}}" for n in names))
    return dict(zip(names, shown.split()))


_PLAIN = {"insert_flag": "0", "wrap_flag": "1", "keypad_cursor_flag": "0", "keypad_flag": "0"}


def test_vpnw_lines_stay_readable_and_the_terminal_modes_go_back(world, user, term):
    conceal = program(world, term, "conceal.py", CONCEAL)
    path = policy(term, user)

    # The control: outside vpnw the program leaves every one of them set.
    assert modes(term) == _PLAIN
    assert term.run(f"{SYSTEM_PYTHON} {conceal}; echo control-after") == 0
    assert modes(term) == {"insert_flag": "1", "wrap_flag": "0", "keypad_cursor_flag": "1",
                           "keypad_flag": "1"}
    assert concealed_at(_capture(term), "control-after")
    term.line(r"printf '\033[0m\033[4l\033[?7h\033[?1l\033>'; clear")
    wait_until(lambda: modes(term) == _PLAIN, 60)

    drawn = term.work / "drawn"
    mark = term.start(f"{term.vpnw} guard --policy {path} -- {SYSTEM_PYTHON} {conceal} {drawn}")
    term.wait_for(r"DENY.*evil\.example:80")
    drawn.touch()
    assert term.finished(mark) == 120
    term.wait_for(r"conceal: bye")
    summary = re.search(r"run r-\S+: 1 connections, 1 denied, 0 failed; exit 120",
                        term.screen())
    assert summary, term.screen()
    shown = _capture(term)
    assert not concealed_at(shown, "1 denied, 0 failed; exit 120")
    assert modes(term) == _PLAIN
    term.type("typed-next")
    term.wait_for(r"typed-next")
    assert not concealed_at(_capture(term), "typed-next")
    term.keys("C-u")


def _capture(term) -> str:
    """The pane with its attributes (capture-pane -e), the whole history."""
    return term._tmux("capture-pane", "-p", "-e", "-J", "-S", "-", "-E", "-", "-t", "t")


# ---- scopes

# Fetches its URLs one after the other (each a connection of its own);
# https without checking the certificate (only the door's decision matters).
SEQUENTIAL = prog_text("channel_sequential.py")


def test_each_scope_holds_for_what_it_says(world, user, term, clean_dns):
    path = policy(term, user, 'allow = ["git.world"]\n')
    fetch = program(world, term, "sequential.py", SEQUENTIAL)
    pypi = "http://pypi.world/whoami"

    # now: this connection only; the next one to the same place asks again.
    mark = guard(term, path, fetch, pypi, pypi)
    press(term, code_of(term, r"pypi\.world:80", 1), "y")
    term.wait_for(r"pypi\.world:80: allowed now", whole=True)
    press(term, code_of(term, r"pypi\.world:80", 2), "n")
    assert term.finished(mark) == 120
    term.wait_for(r"^fetched 1 of 2", whole=True)
    assert scopes(records(term)[-1]) == [("once", "pypi.world:80", "pypi.world", 80),
                                         ("deny", "pypi.world:80", "pypi.world", 80)]

    # this run, host and port: one question; another port is asked about.
    mark = guard(term, path, fetch, pypi, pypi, "https://pypi.world/whoami")
    press(term, code_of(term, r"pypi\.world:80", 3), "r")
    press(term, code_of(term, r"pypi\.world:443"), "n")
    assert term.finished(mark) == 120
    term.wait_for(r"^fetched 2 of 3", whole=True)
    assert [s[0] for s in scopes(records(term)[-1])] == ["run", "run", "deny"]

    # this run, the host: any port, no second question.
    mark = guard(term, path, fetch, pypi, "https://pypi.world/whoami")
    press(term, code_of(term, r"pypi\.world:80", 4), "hr")
    term.wait_for(r"pypi\.world:80: allowed for this run \(pypi\.world, any port\)", whole=True)
    assert term.finished(mark) == 0
    assert scopes(records(term)[-1]) == [("run", "pypi.world", "pypi.world", 80),
                                         ("run", "pypi.world", "pypi.world", 443)]

    # always, a suffix: written back as "*.github.com"; in the same run it
    # covers another name under it, and the next run asks nothing.
    world.dns_set("codeload.github.com", ["140.82.112.6"])
    both = ("http://api.github.com/whoami", "http://codeload.github.com/whoami")
    mark = guard(term, path, fetch, *both)
    term.wait_for(r"vpnw: asks [a-z]{2}: api\.github\.com:80 .*w: every name under \*\.github\.com",
                  whole=True)
    press(term, code_of(term, r"api\.github\.com:80"), "wa")
    term.wait_for(r'"\*\.github\.com" added to allow in \S*agent\.toml', whole=True)
    assert term.finished(mark) == 0
    assert [s[:2] for s in scopes(records(term)[-1])] == [("always", "*.github.com")] * 2
    assert re.search(r'"\*\.github\.com", # added by vpnw guard --ask', path.read_text())
    mark = guard(term, path, fetch, *both)
    assert term.finished(mark) == 0
    assert scopes(records(term)[-1]) == []
    # A suffix is never offered for a name right under a top-level domain.
    assert not re.search(r"asks [a-z]{2}: pypi\.world:80 [^\n]*w: every name", term.history())


# ---- risk notes

def test_a_question_warns_of_new_names_and_addresses_that_are_not_public(world, user, term):
    fetch = program(world, term, "sequential.py", SEQUENTIAL)
    # An earlier run of this user asked for git.world.
    assert term.run(f"{term.vpnw} run -- {SYSTEM_PYTHON} {fetch} http://git.world/whoami") == 0
    path = policy(term, user)
    mark = guard(term, path, fetch, "http://git.world/whoami", "http://pypi.world/whoami",
                 "http://10.200.0.2/whoami")
    press(term, code_of(term, r"git\.world:80"), "y")
    press(term, code_of(term, r"pypi\.world:80"), "n")
    press(term, code_of(term, r"10\.200\.0\.2:80"), "n")
    assert term.finished(mark) == 120
    shown = term.history()
    git = re.search(r"vpnw: asks [a-z]{2}: git\.world:80 [^\n]*", shown).group(0)
    pypi = re.search(r"vpnw: asks [a-z]{2}: pypi\.world:80 [^\n]*", shown).group(0)
    private = re.search(r"vpnw: asks [a-z]{2}: 10\.200\.0\.2:80 [^\n]*", shown).group(0)
    assert "⚠" not in git, git
    assert "⚠ new: not seen in your last 1 runs" in pypi, pypi
    assert "⚠ not a public address: 10.200.0.2" in private, private

"""Asking the person (`guard --ask`): the questions and the keys that answer them.

Pure (no I/O, no clock, no randomness of its own): the orchestrator's shell
(asker.py) feeds it what the broker asks, the keys the person types on
vpnw's own terminal, the time and each question's code, and carries out
what it returns (docs/architecture.md, "Ask").

- One question per destination (name or address, and port), however many
  connections wait on it: the 20 connections an agent opens to a new host
  are one question, and all 20 get its answer.
- Each question has a code of two letters, drawn at random by vpnw and shown
  only in vpnw's own question (its line and the terminal's title). The
  program shares the screen and can draw a question of its own, or erase
  vpnw's and draw a copy naming another host; it cannot know the code, so
  the keys the person types for a drawn question answer nothing, and the
  person is told so.
- An answer is Ctrl-] then the code, then optionally a scope letter, then
  the answer letter:
      y  allow now: the connections waiting on this question, no later one
      r  allow for the rest of this run
      a  allow always: also added to the policy's `allow`
      n  deny for the rest of this run
      d  deny always: also added to the policy's `deny`
  with the scope before the answer letter (none: this host and port):
      h  this host, any port
      w  every name under the host's parent (`*.githubusercontent.com`
         for raw.githubusercontent.com), any port
  A question left unanswered is denied when its time is up, and only for
  the connections that waited on it: the next one asks again.
- Keys answer only as a deliberate sequence, and only while a question is
  open. With no question open every key goes to the program, Ctrl-]
  included; Ctrl-] then a key that is not a code letter goes to the
  program as typed (Ctrl-] twice sends one Ctrl-] to the program). Once
  the two code letters are typed the sequence is vpnw's: a code no open
  question has, or a key that is neither scope nor answer, answers nothing
  and is said. Nothing inside a bracketed paste (ESC [200~ ... ESC [201~)
  is ever an answer. The keys are read from vpnw's own terminal only:
  nothing the program writes or types into its own pty reaches this filter.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

PREFIX = b"\x1d"                 # Ctrl-]
PREFIX_NAME = "Ctrl-]"
PASTE_START, PASTE_END = b"\x1b[200~", b"\x1b[201~"
# A code's letters: none of them is an answer or scope letter, nor easily
# misread (no i, l, o).
CODE_LETTERS = "bcefgjkmpqstuvxz"
CODE_LENGTH = 2
# letter -> answer
KEYS = {b"y": "once", b"r": "run", b"a": "always", b"n": "deny", b"d": "deny-always"}
SCOPE_KEYS = {b"h": "host", b"w": "suffix"}
ANSWERS = ("once", "run", "always", "deny", "deny-always")
SCOPES = ("port", "host", "suffix")
ALLOWS = frozenset({"once", "run", "always"})
REMEMBERED = frozenset({"run", "always", "deny", "deny-always"})   # held for the rest of the run
WRITTEN = frozenset({"always", "deny-always"})
DEFAULT_TIMEOUT = 60.0
# Second-level labels under which registries sell names (co.uk, com.au...):
# a suffix there would be every company's; no wildcard is offered for them.
_SHARED_SECOND_LEVEL = frozenset(("co", "com", "net", "org", "gov", "ac", "edu", "ne", "or",
                                  "go", "gv", "mil", "ltd", "plc", "nom", "gob"))


def keys_hint(code: str, suffix: str | None) -> str:
    """How to answer, as shown in the question: the code first."""
    wide = f" · w: every name under {suffix}" if suffix else ""
    return (f"{PREFIX_NAME} {' '.join(code)} then y: allow now · r: this run · a: always · "
            f"n: deny · d: deny always (h first: any port{wide})")


def wildcard_for(host: str) -> str | None:
    """The suffix rule a `w` answer covers (`*.githubusercontent.com` for
    raw.githubusercontent.com), or None when there is none worth offering:
    an address, or a parent that is a top-level domain or one that
    registries sell names under (`*.co.uk`)."""
    if ":" in host or host.replace(".", "").isdigit():
        return None
    labels = host.split(".")
    if len(labels) < 3:
        return None
    parent = labels[1:]
    if len(parent) == 2 and parent[0] in _SHARED_SECOND_LEVEL and len(parent[1]) == 2:
        return None
    return "*." + ".".join(parent)


def rule_for(host: str, port: int, scope: str = "port") -> str:
    """The policy rule an answer with `scope` covers, as it would be written."""
    if scope == "suffix":
        wildcard = wildcard_for(host)
        if wildcard is None:
            raise ValueError(f"no wildcard for {host}")
        return wildcard
    if scope == "host":
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def covers(rule_scope: tuple[str, str], host: str, port: int) -> bool:
    """Whether an answer held for (scope, rule) covers host:port."""
    scope, rule = rule_scope
    if scope == "suffix":
        return host.endswith(rule[1:]) and len(host) > len(rule) - 1
    if scope == "host":
        return host == rule
    return rule == rule_for(host, port)


@dataclass(frozen=True)
class Reply:
    """What one waiting connection gets."""
    token: object          # the asker's own handle (channel, request number)
    allow: bool
    answer: str            # once | run | always | deny | deny-always
    by: str                # person | timeout | no-terminal
    note: str = ""         # what happened to the policy file, for the reason
    scope: str = ""        # the rule the answer covers (by the person only)


@dataclass(frozen=True)
class Typed:
    """A sequence the person typed after Ctrl-] and a code: an answer when
    `answer` is set and the code is an open question's."""
    code: str
    scope: str = "port"
    answer: str | None = None      # None: a key that is neither scope nor answer


@dataclass
class Question:
    number: int
    host: str
    port: int
    door: str
    code: str
    asked_at: float
    deadline: float
    waiting: list = field(default_factory=list)   # tokens
    risks: tuple = ()      # what the question warns about (set by the asker)

    @property
    def destination(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def rule(self) -> str:
        return rule_for(self.host, self.port)

    @property
    def wildcard(self) -> str | None:
        return wildcard_for(self.host)

    def describe(self) -> dict:
        return {"number": self.number, "destination": self.destination, "door": self.door,
                "rule": self.rule, "waiting": len(self.waiting), "risks": list(self.risks),
                "wildcard": self.wildcard}


class Questions:
    """The run's open questions and the answers that hold for the run.

    `draw_code()` returns a fresh code (the shell draws it at random)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, draw_code=None):
        self.timeout = timeout
        self.draw_code = draw_code or self._next_code   # tests: codes in order
        self.open: OrderedDict[tuple, Question] = OrderedDict()
        # Answers held for the run, newest first: (scope, rule) -> (answer, note)
        self.answered: dict[tuple[str, str], tuple[str, str]] = {}
        self.numbers = 0

    def _next_code(self) -> str:
        n = self.numbers
        return CODE_LETTERS[n // len(CODE_LETTERS) % len(CODE_LETTERS)] + \
            CODE_LETTERS[n % len(CODE_LETTERS)]

    def held(self, host: str, port: int) -> tuple[str, str, str] | None:
        """The answer held for host:port: (answer, note, rule), narrowest
        scope first (a host's own answer wins over its suffix's)."""
        for scope in SCOPES:
            for (held_scope, rule), (answer, note) in reversed(self.answered.items()):
                if held_scope == scope and covers((held_scope, rule), host, port):
                    return answer, note, rule
        return None

    def ask(self, token, host: str, port: int, door: str, now: float
            ) -> tuple[Reply | None, Question | None]:
        """A connection waits on (host, port). Returns (its reply at once, when
        the destination is already answered; a new question, when this is the
        first connection to ask about it)."""
        held = self.held(host, port)
        if held is not None:
            answer, note, rule = held
            return Reply(token, answer in ALLOWS, answer, "person", note, rule), None
        key = (host, port)
        question = self.open.get(key)
        if question is not None:
            question.waiting.append(token)
            return None, None
        self.numbers += 1
        codes = {q.code for q in self.open.values()}
        code = self.draw_code()
        while code in codes:
            code = self.draw_code()
        question = Question(self.numbers, host, port, door, code, now, now + self.timeout,
                            [token])
        self.open[key] = question
        return None, question

    def first(self) -> Question | None:
        """The oldest open question (the one the title shows)."""
        return next(iter(self.open.values()), None)

    def find(self, number: int) -> Question | None:
        for question in self.open.values():
            if question.number == number:
                return question
        return None

    def by_code(self, code: str) -> Question | None:
        for question in self.open.values():
            if question.code == code:
                return question
        return None

    def answer(self, question: Question, answer: str, *, scope: str = "port", note: str = "",
               by: str = "person") -> list[tuple[Question, list[Reply]]]:
        """The person answered: every connection waiting on it gets the
        answer; with a run-long answer, later connections the scope covers
        too, and other open questions it covers are answered with it.
        Returns each question closed with its replies (the first is this one)."""
        if answer not in ANSWERS:
            raise ValueError(f"not an answer: {answer!r}")
        if scope not in SCOPES:
            raise ValueError(f"not a scope: {scope!r}")
        key = (question.host, question.port)
        if self.open.get(key) is not question:
            return []
        rule = rule_for(question.host, question.port, scope) if by == "person" else ""
        closed = [question]
        if by == "person" and answer in REMEMBERED:
            self.answered[(scope, rule)] = (answer, note)
            closed += [q for q in self.open.values()
                       if q is not question and covers((scope, rule), q.host, q.port)]
        elif scope != "port":
            # "now" covers the connections waiting now: those of the other
            # open questions the scope covers too.
            closed += [q for q in self.open.values()
                       if q is not question and covers((scope, rule), q.host, q.port)]
        out = []
        for q in closed:
            del self.open[(q.host, q.port)]
            out.append((q, [Reply(token, answer in ALLOWS, answer, by, note, rule)
                            for token in q.waiting]))
        return out

    def expire(self, now: float) -> list[tuple[Question, list[Reply]]]:
        """Questions whose time is up: denied, not remembered."""
        done = []
        for question in [q for q in self.open.values() if q.deadline <= now]:
            for closed, replies in self.answer(question, "deny", by="timeout"):
                done.append((closed, replies))
        return done

    def forget(self, token_matches) -> list[Question]:
        """Connections that went away (their broker ended) wait no more; a
        question nobody waits on any longer is closed unanswered."""
        closed = []
        for key, question in list(self.open.items()):
            question.waiting = [t for t in question.waiting if not token_matches(t)]
            if not question.waiting:
                del self.open[key]
                closed.append(question)
        return closed

    def next_deadline(self) -> float | None:
        return min((q.deadline for q in self.open.values()), default=None)


class KeyFilter:
    """Takes the answer keys out of what the person types; the rest goes to
    the program. `feed(data, asking)` -> (bytes for the program, typed
    sequences)."""

    def __init__(self):
        self.after_prefix = False
        self.sequence = b""      # the code (and scope) typed so far after the prefix
        self.pasting = False
        self.recent = b""        # the last bytes typed, to see paste markers split across reads

    def _track_paste(self, data: bytes) -> None:
        seen = self.recent + data
        start, end = seen.rfind(PASTE_START), seen.rfind(PASTE_END)
        if start >= 0 or end >= 0:
            self.pasting = start > end
        self.recent = seen[-(len(PASTE_START) - 1):]

    def feed(self, data: bytes, asking: bool) -> tuple[bytes, list[Typed]]:
        if not asking and not self.after_prefix:
            self._track_paste(data)
            return data, []
        out = bytearray()
        typed: list[Typed] = []
        for i in range(len(data)):
            byte = data[i:i + 1]
            self._track_paste(byte)
            if self.pasting:
                out += self.flush()
                out += byte
            elif self.after_prefix:
                done = self._next(byte, asking, out)
                if done is not None:
                    typed.append(done)
            elif byte == PREFIX and asking:
                self.after_prefix = True
            else:
                out += byte
            if typed:
                # One sequence per feed: what follows goes on as typed, and the
                # next question (if any) needs its own deliberate sequence.
                out += data[i + 1:]
                self._track_paste(data[i + 1:])
                break
        return bytes(out), typed

    def _next(self, byte: bytes, asking: bool, out: bytearray) -> Typed | None:
        """One key after the prefix."""
        low = byte.lower()
        if len(self.sequence) < CODE_LENGTH:
            if asking and len(low) == 1 and low.decode("latin-1") in CODE_LETTERS:
                self.sequence += low
                return None
            if not self.sequence:
                self.after_prefix = False
                out += PREFIX if byte == PREFIX else PREFIX + byte   # Ctrl-] twice: one for the program
                return None
            # A code begun and not finished: the sequence was vpnw's.
            code, self.sequence, self.after_prefix = self.sequence.decode(), b"", False
            return Typed(code)
        code = self.sequence[:CODE_LENGTH].decode()
        scope = SCOPE_KEYS.get(self.sequence[CODE_LENGTH:], "port")
        if low in SCOPE_KEYS and len(self.sequence) == CODE_LENGTH:
            self.sequence += low
            return None
        self.sequence, self.after_prefix = b"", False
        return Typed(code, scope, KEYS.get(low))

    def flush(self) -> bytes:
        """A held prefix when the question closed without it being used (a
        code begun is dropped: it was meant for vpnw)."""
        if self.after_prefix and not self.sequence:
            self.after_prefix = False
            return PREFIX
        self.after_prefix, self.sequence = False, b""
        return b""


# ---- where a question may be written on the user's terminal

def title(text: str) -> bytes:
    """An OSC 2 window title (what tmux shows as the pane title), with no
    control characters of the text's own."""
    clean = "".join(ch if ch.isprintable() else " " for ch in text)
    return b"\x1b]2;" + clean.encode("utf-8", "replace")[:400] + b"\x07"


PUSH_TITLE = b"\x1b[22;0t"   # xterm: save the title on its stack (ignored where unknown)
POP_TITLE = b"\x1b[23;0t"
BELL = b"\x07"

"""Asking the person (`guard --ask`): the questions and the keys that answer them.

Pure (no I/O, no clock): the orchestrator's shell (asker.py) feeds it what
the broker asks, the keys the person types on vpnw's own terminal and the
time, and carries out what it returns (docs/architecture.md, "Ask").

- One question per destination (name or address, and port), however many
  connections wait on it: the 20 connections an agent opens to a new host
  are one question, and all 20 get its answer.
- The answer holds for the rest of the run: "once" and "deny" for this run
  only, "always" and "deny always" also go into the policy file. A question
  left unanswered is denied when its time is up, and only for the
  connections that waited on it: the next one asks again.
- Keys answer only as a deliberate sequence, and only while a question is
  open: the prefix Ctrl-] then one letter. Any other key, or the prefix
  followed by anything else, goes to the program unchanged (Ctrl-] twice
  sends one Ctrl-] to the program). With no question open every key goes
  to the program, Ctrl-] included. Nothing inside a bracketed paste
  (ESC [200~ ... ESC [201~) is ever an answer: a pasted text holding the
  sequence goes to the program whole. The keys are read from vpnw's own
  terminal only: nothing the program writes or types into its own pty ever
  reaches this filter.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

PREFIX = b"\x1d"                 # Ctrl-]
PREFIX_NAME = "Ctrl-]"
PASTE_START, PASTE_END = b"\x1b[200~", b"\x1b[201~"
# letter -> answer
KEYS = {b"y": "once", b"a": "always", b"n": "deny", b"d": "deny-always"}
ANSWERS = ("once", "always", "deny", "deny-always")
ALLOWS = frozenset({"once", "always"})
REMEMBERED = frozenset(ANSWERS)         # every answer by the person holds for the run
WRITTEN = frozenset({"always", "deny-always"})
DEFAULT_TIMEOUT = 60.0


def keys_hint() -> str:
    """How to answer, as shown in the question."""
    return (f"{PREFIX_NAME} then y: allow once · a: allow always · "
            "n: deny · d: deny always")


@dataclass(frozen=True)
class Reply:
    """What one waiting connection gets."""
    token: object          # the asker's own handle (channel, request number)
    allow: bool
    answer: str            # once | always | deny | deny-always
    by: str                # person | timeout | no-terminal
    note: str = ""         # what happened to the policy file, for the reason


@dataclass
class Question:
    number: int
    host: str
    port: int
    door: str
    rule: str              # the rule that would allow it, as it would be written
    asked_at: float
    deadline: float
    waiting: list = field(default_factory=list)   # tokens

    @property
    def destination(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def describe(self) -> dict:
        return {"number": self.number, "destination": self.destination, "door": self.door,
                "rule": self.rule, "waiting": len(self.waiting)}


def rule_for(host: str, port: int) -> str:
    """The policy rule that allows exactly this destination."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Questions:
    """The run's open questions and the answers already given."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        self.timeout = timeout
        self.open: OrderedDict[tuple, Question] = OrderedDict()
        self.answered: dict[tuple, tuple[str, str]] = {}    # (host, port) -> (answer, note)
        self.numbers = 0

    def ask(self, token, host: str, port: int, door: str, now: float
            ) -> tuple[Reply | None, Question | None]:
        """A connection waits on (host, port). Returns (its reply at once, when
        the destination is already answered; a new question, when this is the
        first connection to ask about it)."""
        key = (host, port)
        if key in self.answered:
            answer, note = self.answered[key]
            return Reply(token, answer in ALLOWS, answer, "person", note), None
        question = self.open.get(key)
        if question is not None:
            question.waiting.append(token)
            return None, None
        self.numbers += 1
        question = Question(self.numbers, host, port, door, rule_for(host, port), now,
                            now + self.timeout, [token])
        self.open[key] = question
        return None, question

    def first(self) -> Question | None:
        """The question the keys answer: the oldest open one."""
        return next(iter(self.open.values()), None)

    def find(self, number: int) -> Question | None:
        for question in self.open.values():
            if question.number == number:
                return question
        return None

    def answer(self, question: Question, answer: str, *, note: str = "",
               by: str = "person") -> list[Reply]:
        """The person answered: every connection waiting on it gets the
        answer, and later ones to the same destination too."""
        if answer not in ANSWERS:
            raise ValueError(f"not an answer: {answer!r}")
        key = (question.host, question.port)
        if self.open.get(key) is not question:
            return []
        del self.open[key]
        if by == "person" and answer in REMEMBERED:
            self.answered[key] = (answer, note)
        return [Reply(token, answer in ALLOWS, answer, by, note) for token in question.waiting]

    def expire(self, now: float) -> list[tuple[Question, list[Reply]]]:
        """Questions whose time is up: denied, not remembered."""
        done = []
        for question in [q for q in self.open.values() if q.deadline <= now]:
            done.append((question, self.answer(question, "deny", by="timeout")))
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
    the program. `feed(data, asking)` -> (bytes for the program, answers)."""

    def __init__(self):
        self.after_prefix = False
        self.pasting = False
        self.recent = b""        # the last bytes typed, to see paste markers split across reads

    def _track_paste(self, data: bytes) -> None:
        seen = self.recent + data
        start, end = seen.rfind(PASTE_START), seen.rfind(PASTE_END)
        if start >= 0 or end >= 0:
            self.pasting = start > end
        self.recent = seen[-(len(PASTE_START) - 1):]

    def feed(self, data: bytes, asking: bool) -> tuple[bytes, list[str]]:
        if not asking and not self.after_prefix:
            self._track_paste(data)
            return data, []
        out = bytearray()
        answers: list[str] = []
        for i in range(len(data)):
            byte = data[i:i + 1]
            self._track_paste(byte)
            if self.pasting:
                if self.after_prefix:
                    self.after_prefix = False
                    out += PREFIX
                out += byte
            elif self.after_prefix:
                self.after_prefix = False
                answer = KEYS.get(byte.lower()) if asking else None
                if answer is not None:
                    answers.append(answer)
                elif byte == PREFIX:
                    out += PREFIX                # Ctrl-] twice: one for the program
                else:
                    out += PREFIX + byte
            elif byte == PREFIX and asking:
                self.after_prefix = True
            else:
                out += byte
            if answers:
                # One answer per feed: what follows goes on as typed, and the
                # next question (if any) needs its own deliberate sequence.
                out += data[i + 1:]
                self._track_paste(data[i + 1:])
                break
        return bytes(out), answers

    def flush(self) -> bytes:
        """A held prefix when the question closed without it being used."""
        if self.after_prefix:
            self.after_prefix = False
            return PREFIX
        return b""


# ---- where a question may be written on the user's terminal

_OSC_END = (b"\x07", b"\x1b\\")


def mid_escape(tail: bytes) -> bool:
    """Whether the program's output stops inside an escape sequence (so
    bytes of ours written now would land inside it). `tail`: its last bytes."""
    esc = tail.rfind(b"\x1b")
    if esc < 0:
        return False
    rest = tail[esc + 1:]
    if not rest:
        return True
    if rest[:1] == b"]":                      # OSC: ends with BEL or ESC \
        return not any(end in rest for end in _OSC_END)
    if rest[:1] == b"[":                      # CSI: ends with a byte 0x40-0x7e
        return not any(0x40 <= b <= 0x7E for b in rest[1:])
    if rest[:1] == b"\\":                     # the ST of an earlier OSC
        return False
    return len(rest) < 1


def title(text: str) -> bytes:
    """An OSC 2 window title (what tmux shows as the pane title), with no
    control characters of the text's own."""
    clean = "".join(ch if ch.isprintable() else " " for ch in text)
    return b"\x1b]2;" + clean.encode("utf-8", "replace")[:400] + b"\x07"


PUSH_TITLE = b"\x1b[22;0t"   # xterm: save the title on its stack (ignored where unknown)
POP_TITLE = b"\x1b[23;0t"
BELL = b"\x07"

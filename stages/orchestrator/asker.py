"""The orchestrator's side of `guard --ask`: the one place that asks the person.

The shell around ask.Questions (docs/architecture.md, "Ask"):
- the broker's ask links (SOCK_SEQPACKET): the lead's, and one per broker
  worker, handed over on the lead's (broker/hold.py); a question per
  destination comes in on each, an answer goes back on the link of each
  connection that waited, and a destination is asked about once whichever
  process asked;
- vpnw's own terminal, through the relay (terminal.py): the question as a
  line of vpnw's when the program is on the normal screen, and always in
  the terminal's title (OSC 2) with a bell, so a full-screen program's
  picture is never drawn over; each question with a code of two letters
  drawn here at random (the program shares the screen but never sees the
  code: an answer typed for a question it drew answers nothing); the answer
  keys (Ctrl-], the code, a letter) are taken out of what the person types
  before it reaches the program; what the question warns about (an address
  of a private network or the machine itself, a name never seen in this
  user's recent runs: risks.py);
- a Unix socket in vpnw's state directory, `ask/<run id>.sock`, for
  `vpnw ask` in a second terminal: it lists the open questions and takes an
  answer. Only a process of the same user (or root) in vpnw's own network
  namespace is served: the sandbox has a network namespace of its own, and
  the state directory is read-only inside it;
- the policy file, for "always" and "deny always" (config/policy_edit.py),
  through its directory's descriptor, opened here before the program
  starts, and written in place: no name is ever made where the program
  could swap it.

Without a terminal there is no one to ask: every question is denied at once,
as guard would, and vpnw says so once.
"""
from __future__ import annotations

import os
import secrets
import selectors
import socket
import struct
import time

import orjson

from stages.config.policy_edit import EditRefused, add_rule, open_place
from stages.orchestrator import ask, risks
from stages.orchestrator.escapes import TitleReportFilter

MAX_MESSAGE = 4096
MAX_CLIENTS = 16


def socket_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "ask")


class Asker:
    def __init__(self, *, run_id: str, broker_end: socket.socket, policy, relay, say,
                 timeout: float, state_dir: str, program: str):
        self.run_id = run_id
        broker_end.setblocking(False)
        self.links: list[socket.socket] = [broker_end]
        self.policy_file = PolicyWriteBack(policy, run_id)
        self.state_dir = state_dir
        self.seen = None           # risks.SeenNames, made at the first question
        self.relay = relay
        self.say = say
        self.program = program
        self.questions = ask.Questions(timeout, draw_code=_draw_code)
        self.keys = ask.KeyFilter()
        self.said_no_terminal = False
        self.sel = None
        self.clients: set[socket.socket] = set()
        self.listener, self.socket_path = self._listen(state_dir)
        self.on_terminal = None if relay is None else QuestionsOnTerminal(relay, say, self.questions)
        if relay is not None:
            relay.key_filter = self.filter_keys

    # ---- the socket for `vpnw ask`

    def _listen(self, state_dir: str):
        if self.relay is None:
            return None, None
        directory = socket_dir(state_dir)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            os.chmod(directory, 0o700)
            path = os.path.join(directory, f"{self.run_id}.sock")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            listener.bind(_short(path))
            listener.listen(8)
            listener.setblocking(False)
            return listener, path
        except OSError as exc:
            self.say(f"--ask: `vpnw ask` cannot reach this run ({exc.strerror or exc}); "
                     "answer on this terminal")
            return None, None

    def _serve_client(self, client: socket.socket) -> None:
        try:
            data = client.recv(MAX_MESSAGE)
            request = orjson.loads(data) if data else {}
            reply = self._client_request(request) if isinstance(request, dict) else \
                {"ok": False, "message": "not a request"}
            client.send(orjson.dumps(reply))
        except (OSError, orjson.JSONDecodeError):
            pass
        finally:
            self._drop_client(client)

    def _client_request(self, request: dict) -> dict:
        listing = {"run": self.run_id, "program": self.program, "pid": os.getpid(),
                   "questions": [q.describe() for q in self.questions.open.values()]}
        if "answer" not in request:
            return {"ok": True, **listing}
        question = self.questions.find(request.get("number"))
        answer = request.get("answer")
        scope = request.get("scope", "port")
        if question is None:
            return {"ok": False, "message": "that question is no longer open"}
        if answer not in ask.ANSWERS:
            return {"ok": False, "message": f"not an answer: {answer!r}"}
        if scope not in ask.SCOPES or (scope == "suffix" and question.wildcard is None):
            return {"ok": False, "message": f"not a scope for {question.destination}: {scope!r}"}
        said = self.answer(question, answer, scope)
        return {"ok": True, "message": said}

    def _drop_client(self, client: socket.socket) -> None:
        self.clients.discard(client)
        if self.sel is not None:
            try:
                self.sel.unregister(client)
            except (KeyError, ValueError):
                pass
        client.close()

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        if len(self.clients) >= MAX_CLIENTS or not _same_person_outside(client):
            client.close()
            return
        client.setblocking(False)
        self.clients.add(client)
        self.sel.register(client, selectors.EVENT_READ, "ask:client")

    # ---- the selector

    def start(self, sel) -> None:
        self.sel = sel
        sel.register(self.links[0], selectors.EVENT_READ, "ask:broker")
        if self.listener is not None:
            sel.register(self.listener, selectors.EVENT_READ, "ask:listen")

    def handle(self, key, events: int) -> None:
        if key.data == "ask:broker":
            self._read_broker(key.fileobj)
        elif key.data == "ask:listen":
            self._accept()
        elif key.data == "ask:client":
            self._serve_client(key.fileobj)

    def timeout(self, now: float, default: float) -> float:
        deadline = self.questions.next_deadline()
        if deadline is None:
            return default
        return max(0.0, min(default, deadline - now))

    def tick(self) -> None:
        for question, replies in self.questions.expire(time.monotonic()):
            self._send(replies)
            self.say(f"{question.destination}: no answer within "
                     f"{self.questions.timeout:g} s; denied")
        self._show()

    # ---- the broker

    def _read_broker(self, link: socket.socket) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(link, MAX_MESSAGE, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if fds:
                self._new_link(data, fds[0])
                continue
            if not data:
                if self.sel is not None:
                    self.sel.unregister(link)
                self.questions.forget(lambda token: token[0] is link)
                self._show()
                return
            self._on_question(link, data)

    def _new_link(self, data: bytes, fd: int) -> None:
        """A broker worker's own link (hold.Hold.for_worker)."""
        link = socket.socket(fileno=fd)
        if data != b'{"channel": true}' or link.type != socket.SOCK_SEQPACKET or \
                len(self.links) > 64:
            link.close()
            return
        link.setblocking(False)
        self.links.append(link)
        if self.sel is not None:
            self.sel.register(link, selectors.EVENT_READ, "ask:broker")

    def _on_question(self, link: socket.socket, data: bytes) -> None:
        try:
            message = orjson.loads(data)
            token = (link, int(message["n"]))
            host, port = str(message["host"]), int(message["port"])
            door = str(message.get("door", ""))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return
        if self.relay is None:
            if not self.said_no_terminal:
                self.said_no_terminal = True
                self.say("--ask: vpnw has no terminal to ask on; connections the policy "
                         "does not allow are denied, as guard does")
            self._send([ask.Reply(token, False, "deny", "no-terminal")])
            return
        reply, question = self.questions.ask(token, host, port, door, time.monotonic())
        if reply is not None:
            self._send([reply])
        if question is not None:
            question.risks = self._risks(question)
            self.on_terminal.announce(question)

    def _send(self, replies) -> None:
        for reply in replies:
            link, number = reply.token
            message = {"n": number, "allow": reply.allow, "answer": reply.answer,
                       "by": reply.by, "note": reply.note, "scope": reply.scope}
            try:
                link.send(orjson.dumps(message))
            except OSError:
                pass     # the broker is gone: its connections ended with it

    # ---- the person

    def filter_keys(self, data: bytes) -> bytes:
        to_program, typed = self.keys.feed(data, bool(self.questions.open))
        for sequence in typed:
            self._typed(sequence)
        return to_program

    def _typed(self, sequence: ask.Typed) -> None:
        """A sequence the person typed after Ctrl-]: an answer only when its
        code is an open question's."""
        question = self.questions.by_code(sequence.code)
        keys = f"{ask.PREFIX_NAME} {' '.join(sequence.code)}"
        if question is None:
            self.say(f"{keys}: no open question of vpnw's has the code {sequence.code}; nothing "
                     "was answered (a question without vpnw's code was drawn by the program)")
            return
        if sequence.answer is None:
            self.say(f"{keys}: not an answer; {question.destination} is still asked: "
                     f"{ask.keys_hint(question.code, question.wildcard)}")
            return
        if sequence.scope == "suffix" and question.wildcard is None:
            self.say(f"{keys}: {question.destination} has no wildcard to allow (w); "
                     "it is still asked")
            return
        self.answer(question, sequence.answer, sequence.scope)

    def answer(self, question: ask.Question, answer: str, scope: str = "port") -> str:
        """The person's answer, carried out; returns the line said."""
        note = ""
        rule = ask.rule_for(question.host, question.port, scope)
        if answer in ask.WRITTEN:
            note = self.policy_file.add(rule, "allow" if answer == "always" else "deny")
        closed = self.questions.answer(question, answer, scope=scope, note=note)
        waiting = sum(len(replies) for _q, replies in closed)
        for _q, replies in closed:
            self._send(replies)
        line = f"{question.destination}: {_said(answer, scope, rule, waiting)}"
        others = [q.destination for q, _r in closed[1:]]
        if others:
            line += f" (also answers {', '.join(others)})"
        if note:
            line += f"; {note}"
        self.say(line)
        self._show()
        return line

    def _risks(self, question: ask.Question) -> tuple[str, ...]:
        if self.seen is None:
            self.seen = risks.SeenNames(os.path.join(self.state_dir, "runs"), self.run_id)
        return risks.of(question.host, self.seen)

    def _show(self) -> None:
        if self.on_terminal is not None:
            self.on_terminal.show()     # no terminal: nothing is shown, nothing asked

    def close(self) -> None:
        """The run is over: questions still open are denied (the broker is
        gone by now), the socket removed, the title put back."""
        if self.on_terminal is not None:
            self.relay.key_filter = None
            self.on_terminal.close()
        for client in list(self.clients):
            self._drop_client(client)
        self.policy_file.close()
        if self.listener is not None:
            self.listener.close()
            try:
                os.unlink(self.socket_path)
            except OSError:
                pass
        for link in self.links:
            link.close()


class QuestionsOnTerminal:
    """The open questions on vpnw's own terminal, through the relay
    (terminal.py): a line of vpnw's when the program is on the normal
    screen, the oldest question in the title (OSC 2) with a bell when it is
    new, the title put back once none is open."""

    def __init__(self, relay, say, questions: ask.Questions):
        self.relay = relay
        self.say = say
        self.questions = questions
        self.title_shown: str | None = None     # what the title says now (None: ours is not up)
        # The title holds the code: the program never makes the terminal report it.
        relay.screen.title_report_filter = TitleReportFilter()

    def announce(self, question: ask.Question) -> None:
        if not self.relay.screen.merger.alternate:
            warned = "".join(f"; ⚠ {risk}" for risk in question.risks)
            self.say(f"asks {question.code}: {question.destination} ({question.door} door) is not "
                     f"in the policy{warned}. {ask.keys_hint(question.code, question.wildcard)}; "
                     f"denied in {self.questions.timeout:g} s (or `vpnw ask` in another terminal)")
        self.title_shown = None     # a new question: the title and the bell again
        self.show()

    def show(self) -> None:
        """The oldest open question in the title (with a bell when it is new);
        the title put back once none is open."""
        question = self.questions.first()
        # While a question is on the normal screen the program's output waits,
        # so it cannot draw over the question (or over part of it: its host,
        # leaving vpnw's code in place) while the person reads it.
        self.relay.hold_output(question is not None and not self.relay.screen.merger.alternate)
        if question is None:
            if self.title_shown is not None and self.relay.screen.write_control(ask.POP_TITLE):
                self.title_shown = None
            return
        more = len(self.questions.open) - 1
        risky = " ⚠ " + "; ".join(question.risks) + "." if question.risks else ""
        text = (f"vpnw asks {question.code}: allow {question.destination}?{risky} "
                f"Ctrl-] {' '.join(question.code)} then y now, r run, a always, n deny, "
                f"d deny always" + (f" (+{more} more)" if more else ""))
        if text == self.title_shown:
            return
        prefix = ask.PUSH_TITLE if self.title_shown is None else b""
        bell = ask.BELL if self.title_shown is None else b""
        if self.relay.screen.write_control(prefix + ask.title(text) + bell):
            self.title_shown = text

    def close(self) -> None:
        """The run is over: the program's output goes on, the title put back."""
        self.relay.hold_output(False)
        if self.title_shown is not None:
            self.relay.screen.write_control(ask.POP_TITLE, force=True)


class PolicyWriteBack:
    """The policy file, for "always" and "deny always" (config/policy_edit.py):
    its place taken before the program starts, each rule written in place."""

    def __init__(self, policy, run_id: str):
        self.run_id = run_id
        self.source = policy.source if policy is not None else None
        self.sha256 = policy.sha256 if policy is not None else None
        self.place = _policy_place(self.source, self.sha256)

    def add(self, rule: str, which: str) -> str:
        source = self.source
        if not source or source == "<stdin>" or not self.sha256:
            return "the policy was not read from a file: for this run only"
        if source.startswith("@"):
            return (f"{source} is a preset shipped with vpnw: for this run only (to keep answers, "
                    f"copy it: vpnw presets {source[1:]} > {source[1:]}.toml)")
        if isinstance(self.place, str):
            return f"{source} not changed: {self.place}; for this run only"
        try:
            self.sha256 = add_rule(
                self.place, which, rule, expected_sha256=self.sha256,
                run_id=self.run_id, today=time.strftime("%Y-%m-%d", time.gmtime()))
        except EditRefused as exc:
            return f"{source} not changed: {exc}; for this run only"
        return f'"{rule}" added to {which} in {source}'

    def close(self) -> None:
        if not isinstance(self.place, (str, type(None))):
            self.place.close()


def _draw_code() -> str:
    """A question's code: vpnw's own random letters, never the program's to know."""
    return "".join(secrets.choice(ask.CODE_LETTERS) for _ in range(ask.CODE_LENGTH))


def _said(answer: str, scope: str, rule: str, waiting: int) -> str:
    """The answer in words, as it acts."""
    what = {"port": rule, "host": f"{rule}, any port",
            "suffix": f"{rule}: every name under {rule[2:]}, any port (a wildcard)"}[scope]
    if answer == "once":
        connections = f"{waiting} connection{'s' if waiting != 1 else ''}"
        return f"allowed now ({what}; the {connections} waiting; the next one asks again)"
    return {"run": f"allowed for this run ({what})", "always": f"allowed always ({what})",
            "deny": f"denied for this run ({what})",
            "deny-always": f"denied always ({what})"}[answer]


def _policy_place(source, sha256):
    """The policy file's place (policy_edit.open_place), taken before the
    program starts; or why it cannot be written back (a sentence)."""
    if not source or source == "<stdin>" or not sha256:
        return "the policy was not read from a file"
    try:
        return open_place(source)
    except EditRefused as exc:
        return str(exc)


def _short(path: str) -> str:
    """A socket path within the 107 bytes sun_path holds: long ones through
    the directory's descriptor (/proc/self/fd/N/name). The descriptor stays
    open for the run (it is closed on exec)."""
    if len(path.encode()) < 100:
        return path
    directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{directory}/{os.path.basename(path)}"


def _same_person_outside(client: socket.socket) -> bool:
    """The peer is the user who runs vpnw (or root), in vpnw's own network
    namespace: never a process of the sandbox, which has one of its own."""
    try:
        creds = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        if uid not in (os.geteuid(), 0) or pid <= 0:
            return False
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return False

"""`vpnw ask`: the open questions of this user's `guard --ask` runs, from
another terminal (for a full-screen program, whose screen vpnw does not
draw over). Each run listens on `ask/<run id>.sock` in vpnw's state
directory (asker.py); this command lists what each one asks and sends the
person's answer back."""
from __future__ import annotations

import glob
import os
import socket
import sys

import click
import orjson

from stages.orchestrator.ask import ANSWERS, KEYS, SCOPE_KEYS, SCOPES
from stages.orchestrator.asker import MAX_MESSAGE, _short, socket_dir
from stages.record.events import vpnw_state_dir
from stages.wire.exits import ExitCode


def _request(path: str, message: dict) -> dict | None:
    """One request to one run; None when the run is gone (a stale socket)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(5.0)
            sock.connect(_short(path))
            sock.send(orjson.dumps(message))
            data = sock.recv(MAX_MESSAGE)
    except ConnectionRefusedError:
        # Nobody listens: a run that was killed left it. The directory is
        # the user's own (0700); the next `vpnw ask` need not try it again.
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    except OSError:
        return None
    try:
        reply = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return reply if isinstance(reply, dict) else None


def _runs() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(glob.glob(os.path.join(socket_dir(vpnw_state_dir()), "r-*.sock"))):
        listing = _request(path, {"list": True})
        if listing is not None and listing.get("ok"):
            found.append((path, listing))
    return found


def _show(listing: dict, question: dict) -> str:
    waiting = question.get("waiting", 1)
    risks = "".join(f"; ⚠ {risk}" for risk in question.get("risks") or ())
    return (f"{listing['run']} ({listing.get('program', '?')}, pid {listing.get('pid', '?')}) "
            f"#{question['number']}: {question['destination']} by the {question['door']} door; "
            f"rule \"{question['rule']}\"; {waiting} connection{'s' if waiting != 1 else ''} "
            f"waiting{risks}")


def _typed(typed: str) -> tuple[str | None, str]:
    """What the person typed at the prompt: (answer or None, scope)."""
    scope = "port"
    if typed[:1] in _SCOPE_LETTERS and len(typed) == 2:
        scope, typed = _SCOPE_LETTERS[typed[:1]], typed[1:]
    return _LETTERS.get(typed, typed if typed in ANSWERS else None), scope


_LETTERS = {letter.decode(): answer for letter, answer in KEYS.items()}
_SCOPE_LETTERS = {letter.decode(): scope for letter, scope in SCOPE_KEYS.items()}


@click.command("ask")
@click.argument("answer", required=False, type=click.Choice(ANSWERS))
@click.option("--list", "only_list", is_flag=True, help="List the open questions; answer none.")
@click.option("--scope", type=click.Choice(SCOPES), default="port", show_default=True,
              help="What ANSWER covers: the host and port, the host (any port), or every "
                   "name under the host's parent (suffix).")
def ask_command(answer, only_list, scope):
    """Answer what your running `vpnw guard --ask` runs ask: list their open
    questions, ask you about each (on a terminal), or give ANSWER (once: the
    connections waiting now; run: the rest of the run; always; deny: the
    rest of the run; deny-always) to the oldest one."""
    runs = _runs()
    open_questions = [(path, listing, q) for path, listing in runs for q in listing["questions"]]
    if not open_questions:
        click.echo("vpnw: no open questions" + ("" if runs else " (no `guard --ask` run is waiting)"))
        return 0 if answer is None else ExitCode.USAGE
    if answer is not None:
        open_questions = open_questions[:1]
    for path, listing, question in open_questions:
        click.echo(_show(listing, question))
        if only_list:
            continue
        chosen = answer
        if chosen is None:
            if not sys.stdin.isatty():
                continue
            wide = f", w: {question['wildcard']}" if question.get("wildcard") else ""
            typed = click.prompt(f"  y now · r this run · a always · n deny · d deny always "
                                 f"(h first: any port{wide}) · Enter skips",
                                 default="", show_default=False).strip().lower()
            chosen, scope = _typed(typed)
            if chosen is None:
                continue
        reply = _request(path, {"answer": chosen, "number": question["number"], "scope": scope})
        if reply is None:
            click.echo("  vpnw: that run is gone")
        else:
            click.echo(f"  vpnw: {reply.get('message', '')}")
    return 0

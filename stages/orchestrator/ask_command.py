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

from stages.orchestrator.ask import ANSWERS, KEYS
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
    return (f"{listing['run']} ({listing.get('program', '?')}, pid {listing.get('pid', '?')}) "
            f"#{question['number']}: {question['destination']} by the {question['door']} door; "
            f"rule \"{question['rule']}\"; {waiting} connection{'s' if waiting != 1 else ''} waiting")


_LETTERS = {letter.decode(): answer for letter, answer in KEYS.items()}


@click.command("ask")
@click.argument("answer", required=False, type=click.Choice(ANSWERS))
@click.option("--list", "only_list", is_flag=True, help="List the open questions; answer none.")
def ask_command(answer, only_list):
    """Answer what your running `vpnw guard --ask` runs ask: list their open
    questions, ask you about each (on a terminal), or give ANSWER (once,
    always, deny, deny-always) to the oldest one."""
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
            typed = click.prompt("  y once · a always · n deny · d deny always · Enter skips",
                                 default="", show_default=False).strip().lower()
            chosen = _LETTERS.get(typed, typed if typed in ANSWERS else None)
            if chosen is None:
                continue
        reply = _request(path, {"answer": chosen, "number": question["number"]})
        if reply is None:
            click.echo("  vpnw: that run is gone")
        else:
            click.echo(f"  vpnw: {reply.get('message', '')}")
    return 0

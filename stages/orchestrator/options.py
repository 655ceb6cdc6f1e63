"""run, trace and guard's options: one table, read by click (cli.py builds
each command's options from it) and by `quick_parse`, which parses a clean
command line without importing click (~40 ms of every run: click and what it
imports). Pure: no click, no I/O but the one stat click's --log check makes.

`quick_parse` answers only when every word is one it is sure click reads the
same way; for anything else (help, a mistake, a repeated or unknown option,
a value that looks like an option) it answers None and click parses, so every
message, exit code and `--help` is click's own (tests/test_quick_parse.py
holds the two to the same answers).
"""
from __future__ import annotations

import os
import stat

SANDBOXED = ("run", "trace", "guard")
ALL = SANDBOXED

# What an option takes (how click is told, cli.py's _click_option):
FLAG = "flag"                  # is_flag
TEXT = "text"                  # one word, as given
FILE = "file"                  # click.Path(dir_okay=False): not a directory, readable if there
TEXT_OR_FLAG = "text-or-flag"  # a word, or `flag_value` when none follows (is_flag=False)
CHOICE = "choice"              # click.Choice(choices)
SECONDS = "seconds"            # click.FloatRange(min=minimum), default shown


class Option:
    """One option of run/trace/guard as click declares it."""
    __slots__ = ("name", "dest", "kind", "metavar", "help", "modes", "required_in", "choices",
                 "flag_value", "default", "minimum")

    def __init__(self, name, dest, kind, help, *, metavar=None, modes=ALL, required_in=(),
                 choices=(), flag_value=None, default=None, minimum=None):
        self.name, self.dest, self.kind, self.help = name, dest, kind, help
        self.metavar, self.modes, self.required_in = metavar, modes, required_in
        self.choices, self.flag_value, self.minimum = choices, flag_value, minimum
        self.default = False if kind == FLAG else default


OPTIONS = (
    # Plain strings: the loaders word every problem with a file the same way.
    Option("--policy", "policy_file", TEXT, metavar="FILE", required_in=("guard",),
           help="Policy file (TOML) to enforce; '-' reads stdin; @NAME a preset "
                "shipped with vpnw (`vpnw presets`)."),
    Option("--config", "config_file", TEXT, metavar="FILE",
           help="Paths file (TOML) naming the ways out."),
    Option("--via", "via", TEXT, metavar="NAME",
           help="Name of the path to use (default: the config's default, else direct)."),
    Option("--record", "record", TEXT, metavar="FILE",
           help="Write the record to FILE instead of the state directory; "
                "'-' writes it to stdout and moves the program's stdout to stderr."),
    Option("--log", "log", FILE, metavar="FILE",
           help="Write vpnw's human lines to FILE (appended) instead of stderr."),
    Option("--quiet", "quiet", FLAG,
           help="Human lines: only denials and the summary."),
    Option("--events-to", "events_to", TEXT, metavar="COMMAND",
           help="Also feed the event stream (JSON Lines) to COMMAND's stdin (run by sh -c)."),
    Option("--syslog", "syslog", TEXT_OR_FLAG, flag_value="/dev/log", metavar="[TARGET]",
           help="Also send every event to syslog: /dev/log (the default), another socket "
                "path, udp://HOST:PORT or tcp://HOST:PORT (RFC 5424, JSON behind @cee:)."),
    Option("--events-format", "events_format", CHOICE, choices=("jsonl", "ocsf", "ecs"),
           help="What --events-to and --syslog carry: the record's events (jsonl, the "
                "default), or each connection outcome as OCSF Network Activity or ECS."),
    Option("--allow-unix-sockets", "allow_unix_sockets", FLAG,
           help="Let the program reach every Unix socket on this machine (Docker, your "
                "ssh-agent), datagram ones too; its own sockets work without it, and "
                "the policy's [unix] allow names others. Recorded, with a warning."),
    Option("--capture", "capture", FLAG,
           help="Also take every TCP connection that ignores the proxy settings to the "
                "policy (the policy's capture = true does the same)."),
    Option("--no-clipboard", "no_clipboard", FLAG,
           help="On a terminal, drop the program's OSC 52 sequences (which set or "
                "read the clipboard of the terminal's desktop)."),
    Option("--dry-run", "dry_run", FLAG, modes=("guard",),
           help="Decide and record what would be denied, but let it through."),
    Option("--ask", "ask", FLAG, modes=("guard",),
           help="Ask the person on this terminal about a connection no rule "
                "allows, while it waits (also `ask = true` in the policy)."),
    Option("--ask-timeout", "ask_timeout", SECONDS, modes=("guard",), metavar="SECONDS",
           default=60.0, minimum=1.0,
           help="An unanswered question is a denial after this long."),
)


def options_of(mode: str) -> tuple:
    return tuple(o for o in OPTIONS if mode in o.modes)


def quick_parse(mode: str, words: list) -> dict | None:
    """The words after `vpnw MODE` -> {dest: value} for every option of MODE
    (click's defaults for those not given) and "program": a tuple; None when
    click should parse them. Like click with allow_interspersed_args off:
    options end at `--` or at the first word that is not one."""
    known = {o.name: o for o in options_of(mode)}
    given = {}
    at = 0
    while at < len(words):
        word = words[at]
        at += 1
        if word == "--":
            break
        if word[:1] != "-" or word == "-":
            at -= 1                   # the program's name: it and all after it are the program's
            break
        name, equals, attached = word.partition("=")
        option = known.get(name)
        if option is None or option.dest in given:
            return None               # unknown (click's message), help, or given twice
        if option.kind == FLAG:
            if equals:
                return None           # click: "does not take a value"
            given[option.dest] = True
            continue
        if equals:
            value = attached
        elif option.kind == TEXT_OR_FLAG and (at == len(words) or _looks_like_option(words[at])):
            value = option.flag_value
        elif at == len(words) or _looks_like_option(words[at]):
            return None               # no value, or one click would take that looks like an option
        else:
            value = words[at]
            at += 1
        value = _checked(option, value)
        if value is None:
            return None
        given[option.dest] = value
    program = tuple(words[at:])
    if not program:
        return None
    options = options_of(mode)
    if any(mode in o.required_in and o.dest not in given for o in options):
        return None
    return {**{o.dest: given.get(o.dest, o.default) for o in options}, "program": program}


def _looks_like_option(word: str) -> bool:
    return word[:1] == "-" and len(word) > 1     # click's own test (parser.py)


def _checked(option: Option, value: str):
    """The value as click converts it, or None where click might refuse it."""
    if not value:
        return None
    if option.kind == CHOICE:
        return value if value in option.choices else None
    if option.kind == SECONDS:
        digits = value.replace(".", "", 1)
        if not (digits.isascii() and digits.isdigit()):
            return None
        seconds = float(value)
        return seconds if seconds >= option.minimum else None
    if option.kind == FILE:
        try:
            st_mode = os.stat(value).st_mode
        except OSError:
            return value              # not there yet: click takes it as it is
        if stat.S_ISDIR(st_mode) or not os.access(value, os.R_OK):
            return None               # a directory, or unreadable: click says so
    return value

"""`python -m stages.recorder [--record FILE|-] [--human trace|run|quiet] [--events-to CMD] < events.jsonl`

Runs the recorder alone on stdin. With no --record nothing is written but the
human lines, so replaying a run file shows that run again.
"""
from __future__ import annotations

import argparse
import sys

from stages.recorder.main import main_from_fds
from stages.recorder.human import HUMAN_MODES


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stages.recorder",
                                     description="Record vpnw events read on stdin.")
    parser.add_argument("--record", metavar="FILE", default=None,
                        help="write the events to FILE ('-' for stdout); default: write nothing")
    parser.add_argument("--human", choices=HUMAN_MODES, default="trace",
                        help="human lines on stderr: every step, only problems and a summary, or none")
    parser.add_argument("--events-to", metavar="COMMAND", default=None,
                        help="also send the events to COMMAND's stdin (run with sh -c)")
    parser.add_argument("--syslog", metavar="TARGET", nargs="?", const="/dev/log", default=None,
                        help="also send the events to syslog: /dev/log, a socket path, "
                             "udp://HOST:PORT or tcp://HOST:PORT")
    parser.add_argument("--events-format", choices=("jsonl", "ocsf", "ecs"), default="jsonl",
                        help="what --events-to and --syslog carry")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    args = parser.parse_args(argv)
    color = {"auto": None, "always": True, "never": False}[args.color]
    return main_from_fds(sys.stdin.fileno(), record=args.record, human=args.human,
                         tee_command=args.events_to, color=color,
                         syslog_target=args.syslog, events_format=args.events_format)


if __name__ == "__main__":
    sys.exit(main())

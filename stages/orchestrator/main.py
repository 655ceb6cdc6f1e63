"""`vpnw`'s entry point (the console script). A run, trace or guard whose
words options.quick_parse reads cleanly starts without click (a start-up
trick, stages/startup/tricks.py; with the tricks off every command goes to
click); everything else (help, --version, a mistake, the other commands)
goes to click (cli.py), which says and exits exactly as it always has."""
from __future__ import annotations

import errno
import os
import signal
import sys

from stages import startup
from stages.startup.trace import mark

mark("vpnw", "interpreter up")

from stages.orchestrator import options, run_command  # noqa: E402  (after the mark above)
from stages.wire.exits import killed_by  # noqa: E402

# click's shell completion asks through this variable: click answers it.
CLICK_COMPLETION = "_VPNW_COMPLETE"


def main(argv=None) -> None:
    words = sys.argv[1:] if argv is None else list(argv)
    mark("vpnw", "cli imported")
    parsed = None
    if startup.ON and words and words[0] in options.SANDBOXED and CLICK_COMPLETION not in os.environ:
        parsed = options.quick_parse(words[0], words[1:])
    if parsed is None:
        # click only for what quick_parse left (help, a mistake, the other commands)
        from stages.orchestrator.cli import main as with_click
        with_click(words)
        return
    sys.exit(_run(words[0], parsed))


def _run(mode: str, parsed: dict) -> int:
    """The run as click would have called it (cli.py's run/trace/guard), with
    the same endings as cli.main: 121 for a usage problem, 130 for Ctrl-C
    before the stages catch it, 1 for a closed pipe (click's main does that)."""
    try:
        run_command.check_environment()       # as click's group does, first
        code = run_command.execute(mode, parsed.pop("program"), **parsed)
    except run_command.UsageProblem as exc:
        exc.show()
        return exc.exit_code
    except (EOFError, KeyboardInterrupt):
        _say_aborted()
        return killed_by(signal.SIGINT)       # as cli.main
    except OSError as exc:
        if exc.errno != errno.EPIPE:          # click's main exits 1 quietly on it
            raise
        sys.stdout = sys.stderr = None
        return 1
    return code if isinstance(code, int) else 0


def _say_aborted() -> None:
    # click's main closes the terminal's ^C echo with a blank line.
    try:
        sys.stderr.write("\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    main()

"""What one run, trace or guard is asked to do, in two steps: the command
line's options as given (RunOptions: strings and flags, nothing loaded), then
the plan they load to (RunPlan: the policy, the path, the file limits, the
config's files, the secrets). run_command.py makes both before anything
starts; run.py reads the RunRequest that holds them."""
from __future__ import annotations

import os

from stages.startup.records import Factory, FrozenRecord   # not dataclasses, not typing

TYPE_CHECKING = False   # the types are named, not loaded: this module loads before the helper's fork
if TYPE_CHECKING:
    from stages.config.file_limits import FileLimits
    from stages.config.paths import ConfigFiles, PathSpec
    from stages.config.policy import Policy
    from stages.config.secrets import Resolved


class RunOptions(FrozenRecord):
    """run, trace or guard's command line as click (cli.py) or
    options.quick_parse read it: each option's value, or its default."""
    mode: str                        # run | trace | guard
    program: tuple[str, ...]
    policy_file: str | None = None   # a file, "-" for stdin, "@NAME" for a preset
    config_file: str | None = None   # the paths file of this run (read-only to the program)
    via: str | None = None
    record: str | None = None        # file, "-" for stdout, None for the state directory
    events_to: str | None = None
    allow_unix_sockets: bool = False
    log: str | None = None           # human lines to this file instead of stderr
    quiet: bool = False              # human lines: only denials and the summary
    dry_run: bool = False
    syslog: str | None = None        # --syslog TARGET (normalised once checked)
    events_format: str | None = None # what --events-to and --syslog carry ("jsonl" once checked)
    ask: bool = False                # guard --ask
    ask_timeout: float = 60.0        # seconds a question waits before it is a denial
    capture: bool = False            # --capture
    no_clipboard: bool = False       # drop the program's OSC 52 on the user's terminal


class RunPlan(FrozenRecord):
    """What the options load to (UsageProblem, 121, when they cannot)."""
    policy: Policy                   # Policy.allow_all() without --policy
    path: PathSpec
    config_files: ConfigFiles        # what the config names (empty without --config)
    files: FileLimits | None = None  # the policy's [files], resolved; None without one
    secrets: Resolved | None = None  # the policy's secrets, read; None without any
    ask: bool = False                # guard, with --ask or the policy's ask = true
    capture: bool = False            # --capture or the policy's capture = true


class RunRequest(FrozenRecord):
    """One run as the command line asked for it and its plan loaded."""
    options: RunOptions
    plan: RunPlan
    env: dict = Factory(lambda: dict(os.environ))

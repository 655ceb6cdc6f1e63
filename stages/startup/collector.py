"""The garbage collector while a stage loads (start-up tricks,
stages/startup/tricks.py): paused while what lives for the whole run is
made (the broker's loop, the helper's and init's modules), and what was
made then frozen, out of every later collection's sight; and what a
process made frozen before it forks a stage. Off (`startup.ON` false),
pause and freeze do nothing: the collector runs as in any Python program.

Measured and dropped (under 1 ms, tricks.py): no collection while vpnw
itself starts (its modules, click, until its stages are forked)."""
from __future__ import annotations

import gc

from stages import startup


def pause() -> bool:
    """No collection from now: an import makes only what lives for the whole
    run, so a collection would free nothing and walk it all. True when this
    paused it (it was running), for freeze_and_resume."""
    if not startup.ON or not gc.isenabled():
        return False
    gc.disable()
    return True


def freeze_and_resume() -> None:
    """Done loading: what was made is frozen (never looked at again) and
    collections run from now on."""
    if startup.ON:
        gc.freeze()
        gc.enable()


def freeze() -> None:
    """Before a fork: what exists now (every module, the policy's index)
    lives for the whole run. Out of the collector's sight, the child's
    collections never walk it, and its pages stay shared (a collection
    writes to every object it looks at, and a page written after the fork
    is copied, in each process that writes it)."""
    if startup.ON:
        gc.freeze()


def resume() -> None:
    """Collections on, whatever paused them (a forked stage's first step)."""
    gc.enable()

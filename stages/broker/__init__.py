"""The broker: takes connections handed over by the helper, decides each with
the policy, dials through the path, relays the bytes and records every step.

Imports stay light here: the orchestrator imports this in its own process
before forking the broker.
"""
from __future__ import annotations


def main_from_fds(handoff_fd: int, event_fd: int, status_fd: int, *, run_id: str,
                  policy, path, dry_run: bool = False, grace: float = 2.0,
                  workers: int | None = None) -> int:
    """Run the broker until the helper is gone (or SIGTERM); returns the exit
    code: 0, 123 when the path check failed, 125 when the broker itself failed.

    Writes events to `event_fd` and its status (stages/status.py: PathOk or
    PathDown first, Totals last) to `status_fd`. `policy=None` allows everything; `path=None`
    is the direct path. `workers`: broker processes in all (None: one per core,
    broker/workers.py)."""
    path_reported = False
    if path is None or getattr(path, "type", "direct") == "direct":
        # The direct path has nothing to check: say so before loading the
        # loop (asyncio alone costs ~25 ms), so the program starts while the
        # broker loads. Connections handed over meanwhile wait in the link.
        from .. import status
        from ..record import Emitter
        Emitter(event_fd, run_id, path="direct").emit("path.check", path="direct", type="direct",
                                                       ok=True, ms=0)
        status.write(status_fd, status.PathOk(path="direct", type="direct", ms=0))
        path_reported = True
    from .loop import run_broker
    return run_broker(handoff_fd, event_fd, status_fd, run_id=run_id, policy=policy,
                      path=path, dry_run=dry_run, grace=grace, path_reported=path_reported,
                      workers=workers)

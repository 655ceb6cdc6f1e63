"""The broker: takes connections handed over by the helper, decides each with
the policy, dials through the path, relays the bytes and records every step.

Imports stay light here: the orchestrator imports this in its own process
before forking the broker, so what only the broker needs is imported inside
the functions, in the broker, after the fork.
"""
from __future__ import annotations

from stages.broker.warn import warn
from stages.startup import collector
from stages.startup.trace import mark


def main_from_fds(handoff_fd: int, event_fd: int, status_fd: int, *, run_id: str,
                  policy, path, dry_run: bool = False, grace: float = 2.0,
                  workers: int | None = None, ask_fd: int | None = None,
                  record_gate=None, capture: bool = False, secrets=None) -> int:
    """Run the broker until the helper is gone (or SIGTERM); returns the exit
    code: 0, 123 when the path check failed, 125 when the broker itself failed.

    Writes events to `event_fd` and its status (stages/wire/status.py: PathOk or
    PathDown first, Totals last) to `status_fd`. `policy=None` allows everything; `path=None`
    is the direct path (stages/config/paths.py DIRECT). `workers`: broker processes in all (None: one per core,
    broker/workers.py). `ask_fd`: guard --ask's link to the orchestrator
    (hold.py); each worker makes its own from it. `record_gate`: dial only
    while it is open (record/gate.py)."""
    if path is None:    # None means direct: said here once, a PathSpec everywhere below
        from stages.config.paths import DIRECT     # in the broker, after the fork (above)
        path = DIRECT
    path_reported = False
    if path.type == "direct":
        # The direct path has nothing to check: say so before loading the
        # loop (asyncio alone costs ~25 ms), so the program starts while the
        # broker loads. Connections handed over meanwhile wait in the link.
        # In the broker, after the fork (the module's docstring):
        from stages.wire import status
        from stages.record.events import Emitter    # (as above)
        from stages.record.event_types import PathCheck     # (as above)
        Emitter(event_fd, run_id, path="direct").emit(PathCheck(path="direct", type="direct", ok=True, ms=0))
        status.write(status_fd, status.PathOk(path="direct", type="direct", ms=0))
        mark("broker", "path reported")
        path_reported = True
    early = None
    if path_reported:
        # The loop loads while the link is watched (startup.py): a run that
        # never knocks at a door ends without waiting for it, or for workers.
        # (In the broker, after the fork.)
        from stages.broker.startup import load_while_watching
        early = load_while_watching(handoff_fd, lambda: _load_the_loop(capture, tls=secrets is not None))
        mark("broker", "link over, no connection" if early.quiet_end else "loop loaded or needed")
        if early.quiet_end:
            return _end_without_the_loop(early, status_fd)
    fake_names = None
    if capture:
        # Before the workers: they read the names the lead's DNS door gives
        # (fake_ips.py); only a run with capture needs it.
        from stages.broker.fake_ips import FakeNames
        fake_names = FakeNames()
    from stages.broker.workers import Crew, SharedConnNumbers, worker_count   # after the fork
    count, at_once = (workers, False) if workers else worker_count(path)
    crew = numbers = None
    if count > 1:
        # The workers are forked later, from the running loop, once it sees
        # load (or at once when the count was set): workers.py.
        numbers = SharedConnNumbers()

        def worker(link_fd: int, worker_status_fd: int) -> int:
            from stages.broker.loop import run_broker    # the loaded loop's (in the worker)
            return run_broker(link_fd, event_fd, worker_status_fd, run_id=run_id, policy=policy,
                              path=path, dry_run=dry_run, grace=grace, path_reported=True,
                              numbers=numbers, ask_fd=ask_fd, ask_worker=True,
                              record_gate=record_gate,
                              fake_names=fake_names)
        crew = Crew(count - 1, worker,
                    keep=(event_fd, numbers.fd, *(() if ask_fd is None else (ask_fd,)),
                          *(() if fake_names is None else (fake_names.fd,))))
    from stages.broker.loop import run_broker    # loaded by _load_the_loop (or now)
    return run_broker(handoff_fd, event_fd, status_fd, run_id=run_id, policy=policy,
                      path=path, dry_run=dry_run, grace=grace, path_reported=path_reported,
                      numbers=numbers, crew=crew, crew_at_once=at_once, early=early,
                      ask_fd=ask_fd,
                      record_gate=record_gate,
                      fake_names=fake_names, secrets=secrets)


def _load_the_loop(capture: bool, tls: bool = False) -> None:
    """What the first connection needs, loaded before it comes: the loop,
    the decisions (connector.py imports decide.py when the broker starts)
    and, on a run with capture, its doors.

    Only on the direct path (main_from_fds), whose broker never speaks TLS:
    asyncio is loaded without the ssl module (stages/startup/lean_asyncio.py,
    import_asyncio's `without_ssl`).

    No garbage collection while it loads (stages/startup/collector.py): an
    import makes only what lives for the whole run (modules, classes,
    functions), yet each of the collections it set off (a dozen or more)
    looked at all of it. Once it is loaded that is frozen, out of every
    later collection's sight, as fork_stage froze what came before.

    `tls`: the run has secret doors, whose connections the broker opens
    with TLS itself (secret_door.py): asyncio loads with ssl, and the doors'
    module with it."""
    paused = collector.pause()
    try:
        # The loop's modules, in the thread that loads them while the link
        # is watched (stages/broker/startup.py), never before:
        from stages.startup.lean_asyncio import import_asyncio
        import_asyncio(without_ssl=not tls)
        from stages.broker import decide, loop  # noqa: F401
        if capture:
            from stages.broker import capture_door, dns_door  # noqa: F401  (a run with capture's)
        if tls:
            from stages.broker import secret_door  # noqa: F401  (a run with secrets')
    finally:
        if paused:
            collector.freeze_and_resume()


def _end_without_the_loop(early, status_fd: int) -> int:
    """The helper is gone and no connection ever came: zero connections."""
    from stages.wire import status     # in the broker, after the fork
    for message in early.warnings:
        warn(message)
    for handed in early.handed:
        handed.sock.close()
    status.write(status_fd, status.Totals())
    mark("broker", "totals sent")
    return 0

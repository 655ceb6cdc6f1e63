"""Run files written by hand for the recorder's and show's tests (where
the end-to-end tests find a run's files: e2e_support.run_files)."""
from __future__ import annotations

from stages.record.events import encode

T0 = 1_790_682_276_000_000_000


def short_program_lines(*, cut: bool = False, late_after: bool = False) -> list[bytes]:
    """A short program's run as the recorder receives it (issue 28): the
    orchestrator's program.exit arrives before the broker's conn.close, whose
    ts is earlier. `late_after`: a background child's connection after the
    exit; `cut`: no run.end (vpnw killed)."""
    lines = []

    def add(type_, after_ms, conn=None, pid=10, **fields):
        lines.append(encode("r-0dde40", type_, fields, path="direct", conn=conn, pid=pid,
                            ts_ns=T0 + int(after_ms * 1e6)))
    add("run.start", 0, mode="trace", program="curl", policy=None, policy_file=None, via="direct",
        dry_run=False, allow_unix_sockets=False, version="0.1.0", record="-")
    add("conn.request", 10, 1, pid=11, door="http", kind="http-forward", host="a.example", port=80)
    add("conn.open", 12, 1, pid=11, address="198.51.100.1", port=80, via="direct", ms=1)
    add("program.exit", 41, code=0, signal=None)                       # arrived first...
    add("conn.close", 34, 1, pid=11, bytes_up=1, bytes_down=2, ms=22)  # ...happened first
    if late_after:
        add("conn.request", 43, 2, pid=11, door="http", kind="http-forward", host="b.example", port=80)
    if not cut:
        add("run.end", 45, exit_code=0, connections=1, denied=0, would_deny=0, failed=0, ms=45)
    return lines


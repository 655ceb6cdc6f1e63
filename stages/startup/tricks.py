"""The start-up tricks, one row each: what is stood in for or skipped,
where, why, and what it buys (docs/architecture.md, "Start-up budget",
holds the same table; tests/test_startup_budget.py keeps the two equal).

`gain_ms`: the CPU time of the one step the trick changes, without it minus
with it, medians of 15 fresh interpreters each way, interleaved
(scripts/bench/tricks.py, on this project's 2-core machine, load average
1.6-3.0 while other work ran); the freeze before a fork, whose cost falls
after the fork (the child's collections and its copied pages), from traced
`vpnw run -- true` (scripts/bench/run --only startup, 10 rounds, load 4-6:
the recorder's CPU 9.1 ms signed and 4.1 with `--record -` with it, 11.2
and 6.9 without). A trick must buy 1 ms or more; DROPPED lists those that
bought less, now plain code. `VPNW_STARTUP_TRICKS=off` turns every
row of TRICKS off (stages/startup/__init__.py)."""
from __future__ import annotations

from stages.startup.records import NamedTuple


class Trick(NamedTuple):
    name: str
    where: str          # the code that does it (its callers in parentheses)
    instead_of: str     # what is stood in for or skipped
    why: str
    gain_ms: float


TRICKS = (
    Trick("click not loaded for a clean run",
          "stages/orchestrator/options.py quick_parse (main.py)",
          "click and the run command's click options",
          "a run, trace or guard whose words are all ones click reads the same way is parsed "
          "from the same option table; anything else still goes to click", 22.3),
    Trick("lean asyncio",
          "stages/startup/lean_asyncio.py import_asyncio (broker/main.py)",
          "inspect, logging, traceback, linecache, concurrent.futures, subprocess, typing, "
          "contextlib, asyncio.sslproto while asyncio imports; asyncio's debug and info lines "
          "dropped until logging loads",
          "the program's first connection may wait for the broker's loop import", 15.8),
    Trick("pyseccomp without typing and ctypes.util",
          "stages/startup/imports.py import_pyseccomp (helper/sandbox.py)",
          "typing, ctypes.util (and its two `ldconfig -p`) while pyseccomp imports",
          "the helper's way to the seal, when the filter is not cached", 13.9),
    Trick("records, not dataclasses and typing",
          "stages/startup/records.py Record, FrozenRecord, NamedTuple (the run's records)",
          "dataclasses (with inspect, ast, dis, tokenize), typing, and each dataclass's "
          "generated methods",
          "vpnw's way to the helper's and the recorder's forks, and the helper's own", 12.8),
    Trick("orjson without inspect, copy, platform and datetime",
          "stages/startup/imports.py import_orjson (record/events.py)",
          "inspect and copy (dataclasses'), platform (uuid's), the pure-Python datetime "
          "(the capsule from `_datetime`) while orjson imports",
          "vpnw's way to the recorder's fork", 8.3),
    Trick("asyncio without ssl",
          "stages/startup/lean_asyncio.py import_asyncio(without_ssl) (broker/main.py)",
          "ssl and OpenSSL's libraries while asyncio imports (direct path without secrets)",
          "the direct path's broker never speaks TLS; the first connection may wait", 7.1),
    Trick("the lookup threads without logging",
          "stages/startup/lean_asyncio.py thread_pool_executor (broker/connector.py)",
          "logging (with traceback and the rest) while concurrent.futures imports",
          "the run's first name lookup waits for it", 6.8),
    Trick("_json, not json",
          "stages/startup/json_c.py (wire/status.py, helper/held_layer.py)",
          "the json package, which loads re",
          "the helper and init write and read status lines on their way to Ready", 5.5),
    Trick("_socket before the helper's fork",
          "stages/startup/c_halves.py seqpacket_pair",
          "the socket module (with selectors) before the fork",
          "socket then loads after the fork, on both sides at once", 5.2),
    Trick("_thread, not threading",
          "stages/startup/c_halves.py in_a_thread",
          "threading",
          "the recorder signs the record while vpnw waits to exit", 2.6),
    Trick("_sha256 and _blake2, not hashlib",
          "stages/startup/c_digests.py",
          "hashlib, which loads OpenSSL's libcrypto (_hashlib)",
          "the recorder's way to run.start, which the program waits for", 2.3),
    Trick("no collection while the broker's loop loads",
          "stages/startup/collector.py pause, freeze_and_resume (broker/main.py)",
          "the collections the loop's import sets off (then frozen)",
          "the import makes only what lives for the whole run", 2.2),
    Trick("frozen before each fork",
          "stages/startup/collector.py freeze (orchestrator/helper_first.py fork_stage, "
          "broker/workers.py)",
          "a forked stage's collections walking (and copying the pages of) what its parent made",
          "the recorder's way to run.start (measured in traced runs: its CPU, without - with)",
          2.1),
    Trick("no collection in the helper until Ready",
          "stages/startup/collector.py pause, freeze_and_resume "
          "(orchestrator/helper_first.py, helper/main.py, helper/processes.py, "
          "helper/supervisor/launch.py)",
          "the collections the helper's and init's imports set off (then frozen)",
          "the seal waits for them", 1.1),
)

DROPPED = (
    Trick("socket without selectors", "stages/helper/main.py (a plain import socket now)",
          "selectors (its epoll) while socket imports", "the helper's first import", 0.5),
    Trick("_ctypes, not ctypes", "stages/kernel/foreign.py",
          "the ctypes package", "the helper's and the recorder's C calls", 0.7),
    Trick("no collection while vpnw starts",
          "orchestrator/main.py, cli.py, run_command.py, run.py",
          "collections until the stages are forked", "vpnw's own start (to the recorder's fork)",
          0.1),
)

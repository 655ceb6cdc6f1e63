"""The closing hints (stages/recorder/hints.py): only on evidence in the run's
own events, never for a plain failure, a signal or a run that succeeded."""
from __future__ import annotations

from stages.recorder.hints import RunFacts, closing_hints


def ev(type_, conn=None, **fields):
    return {"type": type_, "conn": conn, "fields": fields}


def facts_of(*events) -> RunFacts:
    facts = RunFacts()
    for event in events:
        facts.note(event)
    return facts


START = ev("run.start", mode="run", program="sh")


def test_a_failure_without_evidence_gets_no_hint():
    for exit_event in (ev("program.exit", code=1, signal=None), ev("program.exit", code=130, signal=2),
                       ev("program.exit", code=137, signal=9)):
        code = exit_event["fields"]["code"]
        assert closing_hints(facts_of(START, exit_event, ev("run.end", exit_code=code))) == []


def test_tries_around_the_doors_are_evidence_even_after_a_signal():
    hints = closing_hints(facts_of(START, ev("program.exit", code=130, signal=2, no_route=2),
                                   ev("run.end", exit_code=130)))
    assert len(hints) == 1 and hints[0].startswith("hint: the program exited 130 after 2 tries")
    assert "README" in hints[0]


def test_no_hint_when_the_run_succeeded_or_never_ran_the_program():
    assert closing_hints(facts_of(START, ev("program.exit", code=0, signal=None, no_route=3),
                                  ev("run.end", exit_code=0))) == []
    assert closing_hints(facts_of(START, ev("run.end", exit_code=123, error="path down"))) == []


def test_names_that_could_not_be_resolved_are_named():
    hints = closing_hints(facts_of(
        START, ev("conn.request", 1, host="api.exmaple.com", port=443, kind="http-connect"),
        ev("conn.fail", 1, stage="resolve", error="dns", reason="no such name"),
        ev("conn.request", 2, host="ok.example", port=443, kind="http-connect"),
        ev("conn.fail", 2, stage="dial", error="refused", reason="refused"),
        ev("program.exit", code=6, signal=None), ev("run.end", exit_code=6)))
    assert len(hints) == 1 and "api.exmaple.com" in hints[0] and "ok.example" not in hints[0]


def test_the_files_table_is_named_with_what_it_hid_and_made_read_only():
    start = ev("run.start", mode="run", program="sh", policy_file="/home/u/agent.toml",
               files={"layers": {}, "deny_read": ["/home/u/.ssh"], "deny_read_absent": [],
                      "allow_write": ["/home/u/work", "/tmp"], "landlock_abi": 4})
    hints = closing_hints(facts_of(start, ev("program.exit", code=1, signal=None),
                                   ev("run.end", exit_code=1)))
    assert hints == ["note: the program exited 1 under the [files] table of /home/u/agent.toml, which "
                     "hid /home/u/.ssh (\"No such file or directory\") and made everything read-only "
                     "but /home/u/work, /tmp (\"Read-only file system\")"]


def test_a_refused_unix_socket_is_named():
    hints = closing_hints(facts_of(
        START, ev("unix.deny", path="/run/docker.sock", process=5, program="curl",
                  reason="a socket bound outside the sandbox"),
        ev("unix.deny", path="/run/docker.sock", process=6, program="curl", reason="x"),
        ev("program.exit", code=7, signal=None), ev("run.end", exit_code=7)))
    assert len(hints) == 1 and "Unix socket /run/docker.sock (" in hints[0], hints


def test_a_refused_loopback_port_the_machine_listens_on_names_the_rule():
    hints = closing_hints(facts_of(START, ev("program.exit", code=7, signal=None, loopback_refused=[11434]),
                                   ev("run.end", exit_code=7)))
    assert hints == ["hint: the program exited 7 after a connection to port 11434 of the sandbox's own "
                     "loopback was refused: nothing listens there inside the sandbox, but this machine "
                     "has a listener on it; to let the program reach it, add "
                     "allow = [\"localhost:11434\"] to the policy"]
    two = closing_hints(facts_of(START, ev("program.exit", code=1, signal=None,
                                           loopback_refused=[5432, 6379]), ev("run.end", exit_code=1)))
    assert len(two) == 1 and 'allow = ["localhost:5432", "localhost:6379"]' in two[0]
    # Evidence only: none on a run that succeeded, nor from a field that is not a port list.
    assert closing_hints(facts_of(START, ev("program.exit", code=0, signal=None, loopback_refused=[80]),
                                  ev("run.end", exit_code=0))) == []
    assert closing_hints(facts_of(START, ev("program.exit", code=1, signal=None, loopback_refused="80"),
                                  ev("run.end", exit_code=1))) == []


def test_the_no_route_hint_names_capture_unless_the_run_captured():
    """Issue 44: a program that ignores the proxy settings (plain ssh,
    getent, Node 20's fetch) is sent through the doors by --capture."""
    hints = closing_hints(facts_of(START, ev("program.exit", code=1, signal=None, no_route=1),
                                   ev("run.end", exit_code=1)))
    assert "run it with --capture to send such connections through vpnw's doors" in hints[0]
    captured = dict(START, fields={**START["fields"], "capture": True})
    hints = closing_hints(facts_of(captured, ev("program.exit", code=1, signal=None, no_route=1),
                                   ev("run.end", exit_code=1)))
    assert "--capture" not in hints[0]

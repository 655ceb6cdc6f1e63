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


def test_tries_around_the_doors_are_evidence_even_after_a_crash():
    hints = closing_hints(facts_of(START, ev("program.exit", code=139, signal=11, no_route=2),
                                   ev("run.end", exit_code=139)))
    assert len(hints) == 1 and hints[0].startswith("hint: the program exited 139 after 2 tries")
    assert "README" in hints[0]


def test_no_hint_after_the_program_was_stopped_whatever_it_met():
    """Ctrl-C, Ctrl-\\, kill, a closed terminal: the person knows why it
    ended, so no refusal before it is blamed (README: never after Ctrl-C)."""
    met = [ev("conn.request", 1, host="api.exmaple.com", port=443, kind="http-connect"),
           ev("conn.fail", 1, stage="resolve", error="dns", reason="no such name"),
           ev("unix.deny", path="/run/docker.sock", process=5, program="curl", reason="x")]
    for signal in (1, 2, 3, 9, 15):
        code = 128 + signal
        assert closing_hints(facts_of(START, *met, ev("program.exit", code=code, signal=signal,
                                                      no_route=4, loopback_refused=[5432]),
                                      ev("run.end", exit_code=code))) == [], signal
    # A program that handles SIGINT and exits 130 itself, as a shell does.
    assert closing_hints(facts_of(START, *met, ev("program.exit", code=130, signal=None, no_route=1),
                                  ev("run.end", exit_code=130))) == []


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
    # The refused connection came last: it is named first, the name "earlier".
    assert hints == ["hint: the program exited 6 after its connection to ok.example:443 failed: refused",
                     "hint: earlier, these names could not be resolved on the run's path: "
                     "api.exmaple.com (check the spelling, or that the path's DNS knows them)"], hints


def test_the_files_table_is_named_with_what_it_hid_and_made_read_only():
    start = ev("run.start", mode="run", program="sh", policy_file="/home/u/agent.toml",
               files={"layers": {}, "deny_read": ["/home/u/.ssh"], "deny_read_absent": [],
                      "allow_write": ["/home/u/work", "/tmp"], "landlock_abi": 4})
    hints = closing_hints(facts_of(start, ev("program.exit", code=1, signal=None),
                                   ev("run.end", exit_code=1)))
    assert hints == ["note: the program exited 1 under the [files] table of /home/u/agent.toml, which "
                     "hid /home/u/.ssh (\"No such file or directory\") and made everything read-only "
                     "but /home/u/work, /tmp (\"Read-only file system\")"]


def test_the_files_table_is_named_after_a_run_that_succeeded_too():
    """The kernel tells vpnw of no refused file access: every run under a
    table says what it did, whatever its exit (issue 45)."""
    start = ev("run.start", mode="run", program="sh", policy_file="agent.toml",
               files={"layers": {}, "deny_read": ["/home/u/.ssh"], "deny_read_absent": [],
                      "allow_write": ["/home/u/work"], "landlock_abi": 4})
    hints = closing_hints(facts_of(start, ev("program.exit", code=0, signal=None, no_route=2),
                                   ev("run.end", exit_code=0)))
    assert hints == ["note: the program ran under the [files] table of agent.toml, which hid "
                     "/home/u/.ssh (\"No such file or directory\") and made everything read-only "
                     "but /home/u/work (\"Read-only file system\")"], hints
    # Stopped by the person: nothing.
    assert closing_hints(facts_of(start, ev("program.exit", code=130, signal=2),
                                  ev("run.end", exit_code=130))) == []


def test_a_refused_unix_socket_is_named():
    hints = closing_hints(facts_of(
        START, ev("unix.deny", path="/run/postgresql/.s.PGSQL.5432", process=5, program="psql",
                  reason="a socket bound outside the sandbox"),
        ev("unix.deny", path="/run/postgresql/.s.PGSQL.5432", process=6, program="psql", reason="x"),
        ev("program.exit", code=7, signal=None), ev("run.end", exit_code=7)))
    assert hints == ["hint: the program exited 7 after the sandbox refused it the Unix socket "
                     "/run/postgresql/.s.PGSQL.5432 (the policy's [unix] allow can name it)"], hints


def test_a_socket_that_runs_commands_is_never_offered_to_unix_allow():
    for path, server in (("/tmp/tmux-1000/default", "tmux's server"),
                         ("/run/docker.sock", "the Docker daemon"),
                         ("/var/run/docker.sock", "the Docker daemon"),
                         ("/run/user/1000/docker.sock", "the Docker daemon"),
                         ("/run/user/1000/bus", "a D-Bus bus"),
                         ("/run/dbus/system_bus_socket", "a D-Bus bus"),
                         ("/run/user/1000/systemd/private", "systemd's manager"),
                         ("/tmp/.X11-unix/X0", "an X11 display"), ("@/tmp/.X11-unix/X1", "an X11 display"),
                         ("/run/screen/S-me/1234.pts-0.host", "GNU screen's session"),
                         ("/run/user/1000/podman/podman.sock", "Podman's service"),
                         ("/run/user/1000/emacs/server", "an Emacs server"),
                         ("/run/user/1000/nvim.1234.0", "a Neovim server"),
                         ("/run/user/1000/vscode-ipc-1a2b.sock", "VS Code's terminal"),
                         ("/home/me/.ssh/cm-git@github.com:22", "an ssh connection's master")):
        hints = closing_hints(facts_of(START, ev("unix.deny", path=path, process=5, program="claude",
                                                 reason="a socket bound outside the sandbox"),
                                       ev("program.exit", code=1, signal=None), ev("run.end", exit_code=1)))
        assert len(hints) == 1, (path, hints)
        assert "[unix] allow can name" not in hints[0] and "never name it in [unix] allow" in hints[0], hints
        assert path in hints[0] and server in hints[0] and "runs commands outside the sandbox" in hints[0]


def test_the_hint_names_the_refusal_that_came_last_before_the_exit():
    """Claude Code in tmux: refused the tmux socket, then its API host was
    unreachable and it exited 1: the hint names the failed connection first,
    and says the socket only as what stays refused."""
    hints = closing_hints(facts_of(
        START, ev("unix.deny", path="/tmp/tmux-1000/default", process=5, program="claude",
                  reason="a socket bound outside the sandbox"),
        ev("conn.request", 1, host="api.anthropic.com", port=443, kind="http-connect"),
        ev("conn.fail", 1, stage="dial", error="unreachable", reason="no route to host"),
        ev("program.exit", code=1, signal=None), ev("run.end", exit_code=1)))
    assert hints[0] == ("hint: the program exited 1 after its connection to api.anthropic.com:443 "
                        "failed: no route to host"), hints
    assert hints[1].startswith("note: the sandbox refused the program the Unix socket "
                               "/tmp/tmux-1000/default: tmux's server"), hints
    assert len(hints) == 2
    # A name that failed after a harmless refused socket: the name first, the socket "earlier".
    hints = closing_hints(facts_of(
        START, ev("unix.deny", path="/run/postgresql/.s.PGSQL.5432", process=5, program="psql",
                  reason="a socket bound outside the sandbox"),
        ev("conn.request", 1, host="api.exmaple.com", port=443, kind="http-connect"),
        ev("conn.fail", 1, stage="resolve", error="dns", reason="no such name"),
        ev("program.exit", code=6, signal=None), ev("run.end", exit_code=6)))
    assert hints[0].startswith("hint: the program exited 6; these names could not be resolved"), hints
    assert hints[1].startswith("hint: earlier, the sandbox refused the program the Unix socket "
                               "/run/postgresql/.s.PGSQL.5432 (the policy's [unix] allow"), hints
    # The socket last: it is what the program exited after.
    hints = closing_hints(facts_of(
        START, ev("conn.request", 1, host="api.exmaple.com", port=443, kind="http-connect"),
        ev("conn.fail", 1, stage="resolve", error="dns", reason="no such name"),
        ev("unix.deny", path="/tmp/tmux-0/default", process=5, program="claude", reason="x"),
        ev("program.exit", code=1, signal=None), ev("run.end", exit_code=1)))
    assert hints[0].startswith("note: the program exited 1 after the sandbox refused it the Unix "
                               "socket /tmp/tmux-0/default: tmux's server"), hints
    assert hints[1].startswith("hint: earlier, these names could not be resolved"), hints


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


def test_a_name_the_program_looked_up_itself_is_named_too():
    """With capture the program asks the DNS door itself: an answer without an
    address names the name, as a door's failed lookup does."""
    hints = closing_hints(facts_of(
        START, ev("dns.answer", name="db.internal", type="A", rcode="NXDOMAIN", transport="udp",
                  reason="a special-use name"),
        ev("dns.answer", name="pypi.org", type="AAAA", rcode="NODATA", transport="udp"),
        ev("dns.answer", name="pypi.org", type="A", rcode="NOERROR", transport="udp",
           address="198.18.0.1"),
        ev("program.exit", code=2, signal=None), ev("run.end", exit_code=2)))
    assert hints == ["hint: the program exited 2; these names could not be resolved on the run's "
                     "path: db.internal (check the spelling, or that the path's DNS knows them)"], hints


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

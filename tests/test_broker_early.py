"""The broker's first moments (stages/broker/startup.py): the link is read while
the loop loads, and a run that never knocks at a door ends without the loop.

Real sockets throughout: the handoff link, listening doors on loopback, and a
`load` that stands for the loop's import (it blocks until the test lets it go,
so each test sees which of the three ways out was taken, and when)."""
from __future__ import annotations

import select
import socket
import sys
import threading
import time

import pytest

from progs_support import prog_text
from startup_support import needs_the_tricks
from stages.wire import handoff
from stages.broker.startup import load_while_watching


def door() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


class Load:
    """A loop import that takes as long as the test says."""

    def __init__(self):
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def __call__(self):
        self.started.set()
        self.release.wait(10)
        self.finished.set()


def watch_in_background(link_fd: int, load: Load):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("early", load_while_watching(link_fd, load)))
    thread.start()
    return thread, out


def test_the_helper_gone_and_no_connection_ends_without_waiting_for_the_loop():
    helper_end, broker_end = handoff.link()
    doors = {"http": door(), "socks": door()}
    for name, sock in doors.items():
        handoff.send_door(helper_end, name, sock.fileno())
    helper_end.close()
    load = Load()
    started = time.monotonic()
    early = load_while_watching(broker_end.fileno(), load)
    assert time.monotonic() - started < 5
    assert early.quiet_end and early.link_over
    assert not load.finished.is_set()           # the import was never waited for
    assert [(h.kind, h.door) for h in early.handed] == [("door", "http"), ("door", "socks")]
    assert broker_end.fileno() != -1            # the link is the caller's still
    load.release.set()


def test_a_connection_waiting_at_a_door_when_the_helper_ends_waits_for_the_loop():
    helper_end, broker_end = handoff.link()
    http = door()
    handoff.send_door(helper_end, "http", http.fileno())
    program = socket.create_connection(http.getsockname())   # complete, in the backlog
    program.sendall(b"GET http://evil.example/ HTTP/1.1\r\n\r\n")
    program.close()
    helper_end.close()
    load = Load()
    thread, out = watch_in_background(broker_end.fileno(), load)
    assert load.started.wait(5)
    time.sleep(0.2)
    assert thread.is_alive()                    # waiting for the loop, not ending
    load.release.set()
    thread.join(5)
    early = out["early"]
    assert load.finished.is_set() and early.link_over and not early.quiet_end
    # The handed door still holds the connection for the loop to take.
    conn, _ = early.handed[0].sock.accept()
    assert conn.recv(100).startswith(b"GET http://evil.example/")


def test_a_connection_arriving_while_the_loop_loads_waits_for_it():
    helper_end, broker_end = handoff.link()
    http = door()
    handoff.send_door(helper_end, "http", http.fileno())
    load = Load()
    thread, out = watch_in_background(broker_end.fileno(), load)
    assert load.started.wait(5)
    socket.create_connection(http.getsockname()).close()
    time.sleep(0.2)
    assert thread.is_alive()
    load.release.set()
    thread.join(5)
    early = out["early"]
    assert not early.link_over and not early.quiet_end
    helper_end.close()


def test_once_the_loop_has_loaded_the_link_is_left_to_it():
    helper_end, broker_end = handoff.link()
    socks = door()
    handoff.send_door(helper_end, "socks", socks.fileno())
    load = Load()
    load.release.set()
    early = load_while_watching(broker_end.fileno(), load)
    assert load.finished.is_set() and not early.link_over and not early.quiet_end
    helper_end.close()


def test_a_bad_message_is_dropped_with_a_warning_and_the_watch_goes_on():
    helper_end, broker_end = handoff.link()
    helper_end.send(b"X" * handoff.MESSAGE_SIZE)
    http = door()
    handoff.send_door(helper_end, "http", http.fileno())
    helper_end.close()
    load = Load()
    early = load_while_watching(broker_end.fileno(), load)
    load.release.set()
    assert early.quiet_end
    assert len(early.warnings) == 1 and "bad handoff message" in early.warnings[0]
    assert [h.door for h in early.handed] == ["http"]


def _slow_import(tmp_path, monkeypatch, count: int):
    """A loop import of `count` modules, 20 ms each: (load, the names, the thread it ran in)."""
    names = [f"vpnw_slow_{tmp_path.name}_{i}" for i in range(count)]
    for name in names:
        (tmp_path / f"{name}.py").write_text("import time\ntime.sleep(0.02)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ran_in = []

    def load():
        ran_in.append(threading.current_thread())
        for name in names:
            __import__(name)
    return load, names, ran_in


@pytest.mark.parametrize("quiet", [True, False])
def test_a_quiet_end_halts_the_import_at_its_next_module(tmp_path, monkeypatch, quiet):
    """The helper gone with no connection anywhere while the loop still
    loads: the import thread raises at its next module and ends (it no
    longer competes with the end), and its finder leaves sys.meta_path.
    Control (quiet=False, a connection waiting at the door): every module
    is imported and the loop is waited for."""
    load, names, ran_in = _slow_import(tmp_path, monkeypatch, 40)
    helper_end, broker_end = handoff.link()
    http = door()
    handoff.send_door(helper_end, "http", http.fileno())
    thread, out = watch_in_background(broker_end.fileno(), load)
    deadline = time.monotonic() + 5
    while names[1] not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.005)
    if not quiet:
        socket.create_connection(http.getsockname()).close()
    helper_end.close()
    thread.join(10)
    assert out["early"].quiet_end is quiet
    ran_in[0].join(2)
    assert not ran_in[0].is_alive()
    imported = [name for name in names if name in sys.modules]
    assert (len(imported) < len(names) - 5) if quiet else (imported == names)
    assert not any(type(finder).__name__ == "_Loader" for finder in sys.meta_path)
    for name in names:
        sys.modules.pop(name, None)


def test_the_loop_loads_only_once_the_first_door_has_come():
    """Not while the helper seals: the import would take a core from it."""
    helper_end, broker_end = handoff.link()
    load = Load()
    interval = sys.getswitchinterval()
    thread, out = watch_in_background(broker_end.fileno(), load)
    time.sleep(0.3)
    assert not load.started.is_set()            # no door yet: nothing can connect
    http = door()
    handoff.send_door(helper_end, "http", http.fileno())
    assert load.started.wait(5)
    # The door read off the link before the import ends (an import done
    # first leaves the link's messages to the loop: the test above).
    deadline = time.monotonic() + 5
    while select.select([broker_end], [], [], 0)[0] and time.monotonic() < deadline:
        time.sleep(0.002)
    load.release.set()
    thread.join(5)
    early = out["early"]
    assert load.finished.is_set() and not early.quiet_end
    assert [h.door for h in early.handed] == ["http"]
    assert sys.getswitchinterval() == interval     # short only while the import ran
    helper_end.close()


def test_the_helper_gone_before_any_door_ends_without_the_loop():
    """A sandbox that failed to seal hands no door: the import never begins."""
    helper_end, broker_end = handoff.link()
    helper_end.close()
    load = Load()
    early = load_while_watching(broker_end.fileno(), load)
    assert early.quiet_end and early.handed == []
    time.sleep(0.1)
    assert not load.started.is_set()


# In a fresh interpreter, as in a forked broker that has loaded neither
# socket nor the link's messages: the doors come from the parent (the helper).
_BEGUN_BEFORE_OWN_IMPORTS = prog_text("begun_before_own_imports.py")


def test_the_loop_begins_to_load_on_the_doors_before_the_brokers_own_imports():
    """On the first doors, before the watch loads socket and the link's
    messages (~5 ms of its own): the import, which loads socket first too,
    no longer waits behind them. Failed before: startup.py imported both
    before it read the link."""
    import subprocess
    helper_end, broker_end = handoff.link()
    http = door()
    handoff.send_door(helper_end, "http", http.fileno())
    out = subprocess.run([sys.executable, "-c", _BEGUN_BEFORE_OWN_IMPORTS, str(broker_end.fileno())],
                         pass_fds=(broker_end.fileno(),), capture_output=True, text=True, timeout=60)
    helper_end.close()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "('loop import begun', False, False)", out.stdout


# In a fresh interpreter, as in a forked broker that has not loaded its loop:
# the direct path's import, then a real connection served by asyncio.
_LOOP_WITHOUT_TLS = prog_text("loop_without_tls.py")


@needs_the_tricks
def test_the_direct_paths_loop_loads_without_tls_and_serves():
    """The broker on the direct path never speaks TLS: its loop loads
    without ssl (and OpenSSL), asyncio serves connections as before, and
    `import ssl` is refused only while the loop loads. Failed before: the
    loop's import loaded ssl."""
    import subprocess
    for mode in ("plain", "capture"):
        out = subprocess.run([sys.executable, "-c", _LOOP_WITHOUT_TLS, mode], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == ["ssl loaded: False _ssl loaded: False",
                                           "asyncio sees ssl: False", "echo: hello",
                                           "ssl afterwards: OpenSSL"], (mode, out.stdout)


# In a fresh interpreter, as in a forked broker: the collector on (fork_stage
# turns it on in each stage) or off, then the loop's import.
_LOOP_WITHOUT_COLLECTIONS = prog_text("loop_without_collections.py")


@needs_the_tricks
def test_the_loops_import_sets_off_no_collection_and_is_frozen_after():
    """The import makes only what lives for the whole run: no collection
    looks at it while it loads, and it is frozen once loaded, so later
    collections never look at it either; a collector that was off stays
    off. Failed before: the import set off about a dozen collections."""
    import subprocess
    for state, frozen in (("on", True), ("off", False)):
        out = subprocess.run([sys.executable, "-c", _LOOP_WITHOUT_COLLECTIONS, state],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [
            "collections during the import: 0",
            f"collector on afterwards: {state == 'on'}",
            f"frozen by the import: {frozen}"], (state, out.stdout)

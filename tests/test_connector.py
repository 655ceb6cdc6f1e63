"""The broker's connector alone (stages/broker/connector.py): a request in,
Opened | Denied | Failed out, with exactly the events the record needs, on a
real loopback listener through the real direct dialer."""
from __future__ import annotations

import asyncio
import os
import socket

import pytest

from stages.broker.connector import Connector, Denied, Failed, Opened
from stages.broker.dial import DialError, DirectDialer
from stages.broker.journal import Journal
from stages.config.policy import Policy, parse_policy
from stages.record.events import Emitter, read_events

# Their origins listen on this machine's loopback, which vpnw never dials:
# step 4 (the machine itself) is left out here and tested in test_decide.py
# and the end-to-end tests.
pytestmark = pytest.mark.usefixtures("origins_on_loopback")

POLICY = 'version = 1\nname = "t"\n[policy]\ndefault = "deny"\ndeny_private = false\nallow = ["127.0.0.1"]\n'


def attempt(policy, host, port, *, dry_run=False, dialer=None, machine_step=None):
    """One connect() on a fresh journal; (outcome, events, totals)."""
    r, w = os.pipe()
    journal = Journal(Emitter(w, "r-test", path="direct"), status_fd=-1)
    connector = Connector(journal, policy=policy, dialer=dialer or DirectDialer(), via="direct",
                          dry_run=dry_run, local_addresses=frozenset(), machine_step=machine_step)

    async def go():
        outcome = await connector.connect(1, "socks", "socks5", host, port)
        journal.flush_events()
        return outcome

    outcome = asyncio.run(go())
    os.close(w)
    with os.fdopen(r, "rb") as f:
        events = list(read_events(f))
    if isinstance(outcome, Opened):
        outcome.sock.close()
    return outcome, [(e["type"], e["fields"]) for e in events], journal.totals


@pytest.fixture
def listener():
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def test_allowed_and_open(listener):
    outcome, events, totals = attempt(parse_policy(POLICY), "127.0.0.1", listener)
    assert isinstance(outcome, Opened) and outcome.address == "127.0.0.1" and outcome.port == listener
    assert [t for t, _ in events] == ["conn.request", "policy.allow", "conn.open"]
    assert events[2][1]["via"] == "direct"
    assert totals == {"connections": 0, "denied": 0, "would_deny": 0, "failed": 0}


def test_denied_ends_the_request_without_a_dial(listener):
    outcome, events, totals = attempt(parse_policy(POLICY), "127.0.0.2", listener)
    assert isinstance(outcome, Denied) and outcome.rule == "default"
    assert [t for t, _ in events] == ["conn.request", "policy.deny"]
    assert events[1][1]["enforced"] is True and totals["denied"] == 1


def test_dry_run_records_the_denial_and_goes_on(listener):
    outcome, events, totals = attempt(parse_policy(POLICY), "127.0.0.2", listener, dry_run=True)
    assert [t for t, _ in events][:2] == ["conn.request", "policy.deny"]
    assert events[1][1]["enforced"] is False and totals["would_deny"] == 1
    assert isinstance(outcome, (Opened, Failed))   # 127.0.0.2 may or may not listen: it was dialled


def test_a_refused_dial_is_failed_at_the_dial_stage():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    outcome, events, totals = attempt(Policy.allow_all(), "127.0.0.1", port)
    assert outcome == Failed("dial", "refused", outcome.reason)
    assert events[-1] == ("conn.fail", {"stage": "dial", "error": "refused", "reason": outcome.reason})
    assert totals["failed"] == 1


def test_a_bad_target_is_denied_by_the_target_rule():
    outcome, events, _ = attempt(Policy.allow_all(), "0x7f.1", 80)
    assert isinstance(outcome, Denied) and outcome.rule == "target"
    assert events[-1][0] == "policy.deny"


def test_a_path_down_dial_is_failed_at_the_path_stage():
    class DownPath:
        kind, resolves_at_exit = "proxy", True

        async def dial(self, host, port, addresses):
            raise DialError("path-down", "path office is down: refused")

    outcome, events, _ = attempt(Policy.allow_all(), "example.org", 443, dialer=DownPath())
    assert outcome == Failed("path", "path-down", "path office is down: refused")
    assert [t for t, _ in events] == ["conn.request", "policy.allow", "conn.fail"]


def test_a_bug_in_a_dialer_still_ends_the_request():
    class Broken:
        kind, resolves_at_exit = "proxy", True

        async def dial(self, host, port, addresses):
            raise RuntimeError("boom")

    outcome, events, totals = attempt(Policy.allow_all(), "example.org", 443, dialer=Broken())
    assert isinstance(outcome, Failed) and (outcome.stage, outcome.error) == ("dial", "internal")
    assert [t for t, _ in events] == ["conn.request", "policy.allow", "conn.fail"]
    assert totals["failed"] == 1


def test_requests_decided_in_one_turn_share_one_write_ahead_of_their_dials(listener):
    # Write-ahead (docs/security.md, "A full disk hides nothing"): each
    # decision is in the event pipe before its dial. Requests decided in the
    # same loop turn share that write (one wake of the recorder, not one each).
    from stages.record.gate import RecordGate

    class CountingEmitter(Emitter):
        writes = 0

        def _write(self, data):
            CountingEmitter.writes += 1
            super()._write(data)

    r, w = os.pipe()
    os.set_blocking(r, False)
    seen_at_dial = []

    class LookingDialer(DirectDialer):
        async def dial(self, host, port, addresses):
            try:
                written = os.read(r, 65536)
            except BlockingIOError:
                written = b""
            seen_at_dial.append((CountingEmitter.writes, written.count(b'"policy.allow"')))
            return await super().dial(host, port, addresses)

    gate = RecordGate()
    gate.open()
    journal = Journal(CountingEmitter(w, "r-test", path="direct"), status_fd=-1)
    connector = Connector(journal, policy=parse_policy(POLICY), dialer=LookingDialer(), via="direct",
                          dry_run=False, local_addresses=frozenset(), record_gate=gate)

    async def go():
        return await asyncio.gather(*(connector.connect(n, "socks", "socks5", "127.0.0.1", listener)
                                      for n in (1, 2, 3)))

    outcomes = asyncio.run(go())
    assert all(isinstance(o, Opened) for o in outcomes), outcomes
    for o in outcomes:
        o.sock.close()
    # The first dial found all three decisions written, in one write.
    assert seen_at_dial[0] == (1, 3)
    os.close(r)
    os.close(w)


def test_a_fork_waits_for_every_lookup_thread_and_new_lookups_wait_for_the_fork(monkeypatch):
    # The broker forks its workers from the running loop (workers.py); a
    # thread inside getaddrinfo could hold the C library's resolver locks,
    # which the child would keep held for good. So the fork waits until no
    # lookup thread is inside getaddrinfo, even one whose request gave up
    # waiting for it, and lookups asked for meanwhile wait for the fork.
    import threading
    from stages.broker.connector import LookupThreads
    release = threading.Event()
    real = socket.getaddrinfo

    def slow(host, port, *args):
        release.wait(10)        # the resolver still busy
        return real("127.0.0.1", port, *args)
    monkeypatch.setattr(socket, "getaddrinfo", slow)
    forked = []

    async def go():
        lookups = LookupThreads()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(lookups.getaddrinfo("slow.example", 80), 0.05)
        lookups.pause(lambda: forked.append(True))
        later = asyncio.ensure_future(lookups.getaddrinfo("later.example", 80))
        await asyncio.sleep(0.1)
        assert not forked and lookups.in_flight == 1        # its thread is still in getaddrinfo
        release.set()
        while not forked:
            await asyncio.sleep(0.01)
        assert not later.done() and lookups.in_flight == 0  # waits for the fork
        lookups.resume()
        assert (await later)[0][4][0] == "127.0.0.1"
        lookups.pause(lambda: forked.append(True))          # nothing in flight: at once
        assert forked == [True, True]
        lookups.resume()

    asyncio.run(go())


# --- step 4, the machine itself: on in vpnw, whatever the policy -------------

@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
@pytest.mark.parametrize("dry_run", [False, True])
def test_the_machine_s_loopback_is_never_dialled_without_a_policy(listener, host, dry_run):
    """No policy, even under --dry-run: the listener on this machine's
    loopback is out of reach (the attempt itself reaches it: see
    test_allowed_and_open, with step 4 left out)."""
    outcome, events, _ = attempt(Policy.allow_all(), host, listener, dry_run=dry_run, machine_step=True)
    assert isinstance(outcome, Denied) and outcome.rule == "machine", outcome
    assert f'"localhost:{listener}"' in outcome.reason
    assert [t for t, _ in events] == ["conn.request", "policy.deny"]
    assert events[-1][1]["enforced"] is True


def test_a_name_that_resolves_to_the_loopback_is_refused_after_its_look_up(listener, tmp_path):
    """A name not below localhost that a hosts file maps to 127.0.0.1 is
    looked up to be dialled, and every address it resolved to is judged
    before the dial; the same connector with step 4 left out reaches the
    listener (the control)."""
    from stages.broker.hosts_file import HostsFile
    (tmp_path / "hosts").write_text("127.0.0.1 loopback-alias.test\n")
    (tmp_path / "nsswitch.conf").write_text("hosts: files dns\n")
    outcomes = {}
    for step in (True, False):
        r, w = os.pipe()
        journal = Journal(Emitter(w, "r-test", path="direct"), status_fd=-1)
        connector = Connector(journal, policy=Policy.allow_all(), dialer=DirectDialer(), via="direct",
                              dry_run=False, local_addresses=frozenset(), machine_step=step)
        connector.hosts = HostsFile(str(tmp_path / "hosts"), str(tmp_path / "nsswitch.conf"))

        async def go():
            outcome = await connector.connect(1, "socks", "socks5", "loopback-alias.test", listener)
            journal.flush_events()
            return outcome
        outcome = asyncio.run(go())
        os.close(w)
        with os.fdopen(r, "rb") as f:
            outcomes[step] = (outcome, [e["type"] for e in read_events(f)])
        if isinstance(outcome, Opened):
            outcome.sock.close()
    refused, types = outcomes[True]
    assert isinstance(refused, Denied) and refused.rule == "machine", refused
    assert "loopback-alias.test:%d resolved to 127.0.0.1" % listener in refused.reason
    assert types == ["conn.request", "dns.resolve", "policy.deny"]
    assert isinstance(outcomes[False][0], Opened), outcomes[False]

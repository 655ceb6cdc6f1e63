"""What a person (or a SIEM) reads when something is refused or goes wrong
(issue 28, "Messages").

- The WireGuard wrong key, on a real terminal, said once. The office is the
  test world's WireGuard peer (tests/wg_support.py); its `wrong` path holds a
  private key the peer does not know, so the handshake never completes and
  vpnw stops before the program with exit 123.
- Denials are self-contained: the record's decision carries its destination,
  and the OCSF copy (`--events-to`) renders the refusals, Unix sockets too.
- learn through the office (private destinations) drafts what guard can
  enforce there: deny_private = false, saying why, and the guard command it
  suggests keeps --config and --via; a deny_private denial names the setting,
  and the run says at its start which allow rules deny_private refuses.
- `show` tells a run in the order things happened (docs/record.md, "Order";
  the live trace's order is tests/test_recorder.py's, on the arrival order
  seen here, which a run in the world meets too rarely to test).
"""
from __future__ import annotations

import json
import re
import shlex
import socket

import pytest

from e2e_support import describe, run_events
from stages.record.check import check_run
from stages.config.policy import parse_policy
from wg_support import INTERNAL, PEER_TUNNEL, SITE, WEB_PORT, office_of

pytestmark = pytest.mark.world


@pytest.fixture(scope="module")
def office(world):
    return office_of(world)


def _after_prompt(history: str, typed: str) -> str:
    """What appeared on the pane after the line typed (the command's output)."""
    start = history.index(typed) + len(typed)
    return history[start:]


@pytest.mark.parametrize("mode", ["run", "trace", "quiet"])
def test_the_wrong_key_is_said_once(world, office, term, mode):
    marker = term.work / f"wrong-key-ran-{mode}"
    args = {"run": "run", "trace": "trace", "quiet": "run --quiet"}[mode]
    command = (f"VPNW_WG_HANDSHAKE_TIMEOUT=3 {term.vpnw} {args} --config {office.config} "
               f"--via wrong -- touch {marker}")
    mark = term.start(command)
    assert term.finished(mark, timeout=120) == 123
    assert not marker.exists()
    shown = _after_prompt(term.history(), command)
    shown = shown[:shown.index(f"@@{mark}@@42@@")]
    # The fact (which endpoint, and the likely causes) appears exactly once...
    assert shown.count(f"no handshake with {SITE}:") == 1, shown
    assert shown.count("a wrong key") == 1, shown
    # ...in the sentence that says what vpnw did about it, and the summary follows.
    # ...named once: the reason follows the path's name (it said "wrong (wireguard ...):" again)
    assert re.search(r"^vpnw: the path 'wrong' is down: no handshake with ", shown, re.M), shown
    assert "the program was not started" in shown, shown
    assert re.search(r"^vpnw .*run r-[0-9a-f]+: 0 connections, 0 denied, 0 failed; exit 123", shown,
                     re.M), shown
    if mode == "trace":      # the trace still shows the path check's own line, without the repeat
        assert re.search(r"path wrong DOWN", shown), shown
    else:                    # all vpnw says: the one message and the summary (was ~1,000 characters)
        said = [line for line in shown.splitlines() if line.startswith("vpnw")]
        assert len(said) == 2 and sum(len(line) for line in said) < 600, said


def test_a_denial_names_its_destination_and_the_ocsf_copy_renders_it(world, user, tmp_path):
    work = world.workdir(user)
    outside = work / "outside.sock"            # a socket bound outside the sandbox (by the test)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(outside))
    outside.chmod(0o777)
    listener.listen(1)
    copy = work / "ocsf.jsonl"
    policy = world.file("deny-all.toml", 'version = 1\nname = "none"\n\n[policy]\ndefault = "deny"\n')
    connect = f'import socket; socket.socket(socket.AF_UNIX).connect("{outside}")'
    try:
        r = world.vpnw(["guard", "--policy", str(policy), "--events-format", "ocsf",
                        "--events-to", f"cat > {copy}", "--", "sh", "-c",
                        f"curl -sS --max-time 10 http://evil.example:8080/x; python3 -c '{connect}'"],
                       user=user, timeout=120)
    finally:
        listener.close()
    assert r.returncode == 120, describe(r)
    assert "Operation not permitted" in r.stderr, describe(r)      # the Unix socket: EPERM
    events = run_events(r)
    assert check_run(events) == [], check_run(events)
    request = next(e for e in events if e["type"] == "conn.request")
    deny = next(e for e in events if e["type"] == "policy.deny")
    assert {k: deny["fields"][k] for k in ("host", "port", "door")} == \
        {"host": "evil.example", "port": 8080, "door": "http"} == \
        {k: request["fields"][k] for k in ("host", "port", "door")}, (request, deny)
    docs = [json.loads(line) for line in copy.read_text().splitlines()]
    refused = [d for d in docs if d["activity_id"] == 5]
    assert [d["metadata"]["event_code"] for d in refused] == ["policy.deny", "unix.deny"], docs
    assert refused[0]["dst_endpoint"] == {"hostname": "evil.example", "port": 8080}, refused
    assert refused[1]["dst_endpoint"] == {"name": str(outside)}, refused
    assert refused[1]["actor"]["process"]["name"] == "python3", refused


def test_learn_through_the_office_drafts_what_guard_enforces_there(world, office, user):
    state = world.state_home(user)
    program = ["sh", "-c", f"curl -sS --max-time 20 http://{INTERNAL}:{WEB_PORT}/hello.txt; "
                           f"curl -sS --max-time 20 http://{PEER_TUNNEL}:{WEB_PORT}/hello.txt"]
    traced = world.vpnw(["trace", "--config", str(office.config), "--via", "office-dns", "--", *program],
                        user=user, state_home=state, timeout=120)
    assert traced.returncode == 0 and traced.stdout == "hello from the office\n" * 2, describe(traced)
    learned = world.vpnw(["learn", "--name", "office"], user=user, state_home=state)
    assert learned.returncode == 0, describe(learned)
    draft = learned.stdout
    assert parse_policy(draft, "office.toml").deny_private is False, draft
    assert (f"# The traced program reached private destinations ({PEER_TUNNEL}:{WEB_PORT}, "
            f"{INTERNAL}:{WEB_PORT}):\n# deny_private = true would refuse them") in draft, draft
    suggested = re.search(r"^#   (vpnw guard .*) -- PROGRAM$", draft, re.M)
    assert suggested, draft
    words = shlex.split(suggested.group(1))
    assert words[2:6] == ["--config", str(office.config), "--via", "office-dns"], words
    work = world.workdir(user)
    (work / "office.toml").write_text(draft)
    (work / "office.toml").chmod(0o644)
    # The command as learn suggests it, run where the draft was written: the office is reached.
    guarded = world.vpnw([*words[1:], "--", *program], user=user, state_home=state, cwd=work, timeout=120)
    assert guarded.returncode == 0 and guarded.stdout == "hello from the office\n" * 2, describe(guarded)
    # The control: the old draft's deny_private = true refuses what its own allow rules name,
    # and each denial names the setting and the allow rule it overrides.
    (work / "strict.toml").write_text(draft.replace("deny_private = false", "deny_private = true"))
    (work / "strict.toml").chmod(0o644)
    strict = world.vpnw(["guard", "--config", str(office.config), "--via", "office-dns", "--policy",
                         "strict.toml", "--", *program], user=user, state_home=state, cwd=work, timeout=120)
    assert strict.returncode == 120 and "hello" not in strict.stdout, describe(strict)
    denials = [e["fields"] for e in strict.events() if e["type"] == "policy.deny"]
    assert [d["host"] for d in denials] == [INTERNAL, PEER_TUNNEL], denials
    for d in denials:
        assert d["rule"] == "deny_private" and "refused by deny_private = true (set in strict.toml), " \
            "which comes before allow rule" in d["reason"], d
        assert re.search(r"^vpnw .*DENY .*refused by deny_private = true \(set in strict\.toml\)",
                         strict.stderr, re.M), describe(strict)
    # ...and the run said so once, at its start, naming where the setting is and the rules.
    line = next(n for n, text in enumerate((work / "strict.toml").read_text().splitlines(), 1)
                if text.startswith("deny_private"))
    notes = [text for text in strict.stderr.splitlines() if "note: deny_private = true" in text]
    assert len(notes) == 1 and f"note: deny_private = true (strict.toml line {line}) comes first " \
        f"and refuses what allow rules " in notes[0], describe(strict)
    assert f'"{INTERNAL}' in notes[0] and f'"{PEER_TUNNEL}' in notes[0], notes
    assert strict.stderr.index(notes[0]) < strict.stderr.index("DENY"), describe(strict)
    start = next(e["fields"] for e in strict.events() if e["type"] == "run.start")
    assert start["deny_private_shadows"]["set"] == f"strict.toml line {line}", start
    # the draft as learned (deny_private = false) has nothing to say
    assert "note: deny_private" not in guarded.stderr, describe(guarded)


def test_show_tells_a_short_program_in_the_order_things_happened(world, user):
    state = world.state_home(user)
    # The file's order varies with the writers' timing (tests/test_recorder_runs.py
    # has the case where program.exit arrived first); what show prints follows ts.
    for _ in range(3):
        r = world.vpnw(["trace", "--", "curl", "-sS", "-o", "/dev/null", "http://api.github.com/whoami"],
                       user=user, state_home=state, timeout=60)
        assert r.returncode == 0, describe(r)
        events = r.events()
        shown = world.vpnw(["show", events[0]["run"]], user=user, state_home=state)
        assert shown.returncode == 0, describe(shown)
        times = re.findall(r"^vpnw (\d\d:\d\d:\d\d\.\d{3})  ", shown.stdout, re.M)
        assert len(times) >= 6 and times == sorted(times), shown.stdout
        in_time = sorted(events, key=lambda e: e["ts"])
        assert in_time[0]["type"] == "run.start" and in_time[-1]["type"] == "run.end"

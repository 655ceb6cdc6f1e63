"""The digest chain: the recorder seals every line, `show --verify` finds
where a file was cut or changed, and an older file is told apart from a
broken one (docs/record.md, "Tamper evidence")."""
from __future__ import annotations

import hashlib
import json
import os

import pytest
from click.testing import CliRunner

from stages.record.events import DIGEST_SUFFIX_LEN, split_digest
from stages.recorder.main import main_from_fds
from stages.record.chain import UNCHAINED, Chain, verify
from stages.recorder.commands import show_command

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO = os.path.join(HERE, "golden", "demo_agent_trace.jsonl")


def recorded(tmp_path, data: bytes) -> bytes:
    """`data` through the recorder, as a run file."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    record = tmp_path / "run.jsonl"
    fd = os.open(source, os.O_RDONLY)
    try:
        assert main_from_fds(fd, record=str(record), human="quiet") == 0
    finally:
        os.close(fd)
    return record.read_bytes()


@pytest.fixture
def chained(tmp_path) -> list[bytes]:
    with open(DEMO, "rb") as f:
        return recorded(tmp_path, f.read()).splitlines(keepends=True)


def test_the_definition(chained):
    """d(1) = SHA-256(body 1); d(n) = SHA-256(hex d(n-1) + body n); body = the
    line's bytes without ,"d":"…"} and its newline, closed by }."""
    prev = b""
    for raw in chained:
        event = json.loads(raw)
        line = raw.rstrip(b"\n")
        assert line.endswith(b',"d":"' + event["d"].encode() + b'"}')
        body = line[:-DIGEST_SUFFIX_LEN] + b"}"
        assert json.loads(body) == {k: v for k, v in event.items() if k != "d"}
        assert hashlib.sha256(prev + body).hexdigest() == event["d"]
        prev = event["d"].encode()
    with open(DEMO, "rb") as f:
        originals = [json.loads(line) for line in f]
    assert [{k: v for k, v in json.loads(r).items() if k != "d"} for r in chained] == originals


def test_a_whole_file_verifies(chained):
    verdict = verify(chained)
    assert verdict.status == "whole" and verdict.exit_code == 0
    assert verdict.lines == len(chained)
    assert verdict.digest == json.loads(chained[-1])["d"]


def flip(line: bytes) -> bytes:
    """One byte changed inside a host name (the JSON stays valid)."""
    i = line.index(b"github")
    return line[:i] + b"G" + line[i + 1:]


def test_every_kind_of_edit_is_found_and_placed(chained):
    n = len(chained)
    target = next(i for i, raw in enumerate(chained) if b"github" in raw and i > 2)
    cases = {
        "flipped byte": (chained[:target] + [flip(chained[target])] + chained[target + 1:],
                         f"line {target + 1}: the chain breaks here"),
        "removed line": (chained[:target] + chained[target + 1:],
                         f"line {target + 1}: the chain breaks here"),
        "moved lines": (chained[:target] + [chained[target + 1], chained[target]] + chained[target + 2:],
                        f"line {target + 1}: the chain breaks here"),
        "added line": (chained[:target] + [chained[target]] + chained[target:],
                       f"line {target + 2}: the chain breaks here"),
        "cut end": (chained[:-1], f"the file ends after line {n - 1} without run.end"),
        "cut inside a line": (chained[:-1] + [chained[-1][:40]], f"line {n} is cut"),
        "cut start": (chained[1:], "line 1: the chain breaks here"),
        "line without a digest": (chained[:target] + [chained[target][:-DIGEST_SUFFIX_LEN - 1] + b"}\n"]
                                  + chained[target + 1:], f"line {target + 1} has no digest"),
        "digest changed": (chained[:-1] + [chained[-1][:-5] + (b"0" if chained[-1][-5:-4] != b"0" else b"1")
                                           + chained[-1][-4:]], f"line {n}: the chain breaks here"),
    }
    for name, (lines, where) in cases.items():
        verdict = verify(lines)
        assert verdict.status == "broken" and verdict.exit_code == 1, (name, verdict)
        assert verdict.message.startswith(where), (name, verdict.message)


def test_an_older_file_is_unchained_not_broken():
    with open(DEMO, "rb") as f:
        verdict = verify(f)
    assert verdict.status == "unchained" and verdict.exit_code == 2
    assert verdict.message == UNCHAINED


def test_a_foreign_or_stale_digest_is_replaced(tmp_path, chained):
    # Replayed: the same bytes again. A "d" that is not the last member is
    # dropped before sealing, so a line never holds two.
    assert recorded(tmp_path, b"".join(chained)).splitlines(keepends=True) == chained
    event = json.loads(chained[0])
    odd = json.dumps({"d": "x" * 64, **{k: v for k, v in event.items() if k != "d"}},
                     separators=(",", ":")).encode() + b"\n"
    again = recorded(tmp_path, odd + b"".join(chained[1:])).splitlines(keepends=True)
    assert again[0].count(b'"d":') == 1
    assert verify(again).status == "whole"


def test_split_digest_only_takes_the_recorders_suffix():
    line = Chain().seal(b'{"v":1,"fields":{}}')
    body, digest = split_digest(line)
    assert body == b'{"v":1,"fields":{}}' and len(digest) == 64
    assert split_digest(b'{"v":1,"fields":{"d":"' + b"a" * 64 + b'"}}') is None
    assert split_digest(line.replace(digest, digest.upper())) is None
    assert split_digest(b"") is None


def test_show_verify_exit_codes_and_messages(tmp_path, chained, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(b"".join(chained))
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(chained[:-2]))
    runner = CliRunner()
    result = runner.invoke(show_command, ["--verify", str(whole)])
    # The chain is whole, but the recorder run alone signs nothing: nothing
    # to check it against (2); tests/test_e2e_signed_end.py has signed runs.
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"{whole}: whole and unaltered: {len(chained)} lines")
    assert "signature: not checked: none: no .minisig beside the file" in result.output
    result = runner.invoke(show_command, ["--verify", str(cut)])
    assert result.exit_code == 1
    assert f"the file ends after line {len(chained) - 2} without run.end" in result.output
    result = runner.invoke(show_command, ["--verify", DEMO])
    assert result.exit_code == 2 and UNCHAINED in result.output
    result = runner.invoke(show_command, ["--verify", "/etc/passwd"])
    assert result.exit_code == 121 and "is not a vpnw run file" in result.output
    result = runner.invoke(show_command, ["--verify", "--summary", str(whole)])
    assert result.exit_code == 121

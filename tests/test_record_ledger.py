"""The ledger of runs under runs that end together, and the signing key's
files (docs/record.md, "The signed end", "The ledger"). Real processes, a
real flock, real files; the end-to-end side is tests/test_e2e_signed_end.py."""
from __future__ import annotations

import os

import orjson
import pytest

from stages.record import evidence, ledger, signing
from stages.record.chain import Chain
from stages.record.events import encode
from stages.recorder.seal import Sealer

RUNS, ENDERS = 25, 6


def a_run_file(path: str, run_id: str) -> tuple[dict, dict]:
    chain = Chain()
    lines = [chain.seal(encode(run_id, "run.start", {"mode": "run"}).rstrip(b"\n")),
             chain.seal(encode(run_id, "run.end", {"exit_code": 0, "connections": 0, "denied": 0,
                                                   "would_deny": 0, "failed": 0, "ms": 1.0}).rstrip(b"\n"))]
    with open(path, "wb") as out:
        out.write(b"\n".join(lines) + b"\n")
    return orjson.loads(lines[0]), orjson.loads(lines[1])


def test_runs_ending_together_each_get_one_whole_line_in_order(tmp_path, monkeypatch):
    """ENDERS processes each seal RUNS run files at once: every entry is
    there once, whole, numbered 1..N with the chain unbroken, and each run's
    signature names the place it got."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    Sealer.open()                       # the key and the ledger, as the first run makes them
    pids = []
    for ender in range(ENDERS):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sealer = Sealer.open()
                for n in range(RUNS):
                    path = str(tmp_path / f"r-{ender:02x}{n:04x}.jsonl")
                    start, end = a_run_file(path, f"r-{ender:02x}{n:04x}")
                    fd = os.open(path, os.O_WRONLY)
                    sealer.seal(fd, path, start, end, end["d"])
                    os.close(fd)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    book = ledger.read()
    assert book.problem is None
    assert [e["seq"] for e in book.entries] == list(range(1, RUNS * ENDERS + 1))
    assert len({e["run"] for e in book.entries}) == RUNS * ENDERS
    key = evidence.public_key_for(None)
    for entry in book.entries[:: RUNS]:
        found = evidence.check(entry["file"], key=key, ledger=book)
        assert found.exit_code == 0, found.layers


def test_two_runs_starting_together_make_one_key(tmp_path):
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            try:
                key = signing.load_secret(str(tmp_path / "keys"))
                os.write(1, b"")
                with open(tmp_path / f"id-{os.getpid()}", "w") as out:
                    out.write(key.id_text)
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    ids = {p.read_text() for p in tmp_path.glob("id-*")}
    assert len(ids) == 1
    assert sorted(os.listdir(tmp_path / "keys")) == [signing.SECRET_NAME]
    assert (tmp_path / "keys" / signing.SECRET_NAME).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "keys").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("text", ["", "untrusted comment: x\n", "untrusted comment: x\nAAAA\n",
                                  "hello\nRWQ=\n"])
def test_a_key_file_that_is_not_a_key_is_refused_with_the_fix(tmp_path, text):
    (tmp_path / signing.SECRET_NAME).write_text(text)
    with pytest.raises(signing.KeyProblem) as caught:
        signing.load_secret(str(tmp_path))
    assert str(caught.value).startswith(f"{tmp_path / signing.SECRET_NAME} is not a vpnw signing key")
    assert "fix: make it readable by you, or move it away" in str(caught.value)

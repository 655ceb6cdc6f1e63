"""The seccomp filter's cache (stages/helper/seccomp_cache.py, docs/security.md
"The seccomp filter's cache"): libseccomp's BPF made once at install and
loaded by the helper instead of pyseccomp's. Each cached program is the one
libseccomp makes for its rules; a key that does not match, and a cache that
is not protected like the code or is not a table of programs, are misses:
libseccomp answers instead, and the run goes on. A real run of root and of
vpnwtest uses the installed cache (the helper never imports pyseccomp)."""
from __future__ import annotations

import marshal
import os
import sys
from pathlib import Path

import pytest

from e2e_support import audited_run

from stages.helper import seal, seccomp_cache, seccomp_rules

EVERY_WAY = seccomp_cache.COMBINATIONS      # (allow_unix_sockets, supervised)


def _libseccomps(unix: bool, supervised: bool) -> bytes:
    """What libseccomp makes of the rules, through pyseccomp: the fallback."""
    return seccomp_rules.filter_bpf(unix, supervised=supervised)


@pytest.fixture
def cache(tmp_path) -> Path:
    path = tmp_path / "seccomp_filters.marshal"
    seccomp_cache.write(str(path))
    return path


def test_each_cached_program_is_the_one_libseccomp_makes_for_its_rules(cache):
    assert oct(cache.stat().st_mode & 0o777) == "0o644"
    for unix, supervised in EVERY_WAY:
        cached = seccomp_cache.cached_bpf(unix, supervised, str(cache))
        assert cached is not None and cached == _libseccomps(unix, supervised), (unix, supervised)
    # Control: the three programs differ, so a mixed-up key would show.
    assert len({seccomp_cache.cached_bpf(u, s, str(cache)) for u, s in EVERY_WAY}) == 3


def test_the_helper_takes_the_cached_program_and_it_is_libseccomps(cache, monkeypatch):
    """_before_the_plan, as the helper runs it: with the cache, pyseccomp is
    not asked (its filter_bpf would fail here), and the bytes are libseccomp's."""
    expected = {way: _libseccomps(*way) for way in EVERY_WAY}
    monkeypatch.setattr(seccomp_cache, "FILE", str(cache))
    monkeypatch.setattr(seal, "_supervised", lambda unix: not unix)

    def no_libseccomp(*_args, **_kwargs):
        raise AssertionError("libseccomp was asked although the cache has the program")
    monkeypatch.setattr(seccomp_rules, "filter_bpf", no_libseccomp)
    for unix in (False, True):
        assert seal._before_the_plan(unix).seccomp_bpf == expected[(unix, not unix)]


def _other_facts(monkeypatch):
    monkeypatch.setattr(seccomp_cache, "library_facts",
                        lambda: b"libseccomp 9.9.9 api 99 " + os.uname().machine.encode())


def test_a_key_that_does_not_match_is_a_miss_and_libseccomp_makes_the_filter(cache, monkeypatch):
    # Made for another libseccomp (version, API level)...
    _other_facts(monkeypatch)
    assert all(seccomp_cache.cached_bpf(u, s, str(cache)) is None for u, s in EVERY_WAY)
    monkeypatch.undo()
    assert seccomp_cache.cached_bpf(False, True, str(cache)) is not None      # control
    # ...or for other rules: one rule more (as a new vpnw would have).
    rules = seccomp_rules.filter_rules
    monkeypatch.setattr(seccomp_rules, "filter_rules", lambda unix, supervised=False: [
        *rules(unix, supervised), seccomp_rules.SyscallRule("ptrace", 1)])
    assert all(seccomp_cache.cached_bpf(u, s, str(cache)) is None for u, s in EVERY_WAY)
    monkeypatch.undo()
    # The helper then has libseccomp make it, and runs.
    _other_facts(monkeypatch)
    monkeypatch.setattr(seccomp_cache, "FILE", str(cache))
    monkeypatch.setattr(seal, "_supervised", lambda unix: False)
    assert seal._before_the_plan(False).seccomp_bpf == _libseccomps(False, False)


def _bad_caches(tmp_path: Path, good: bytes) -> dict[str, Path]:
    """Caches that must never be used: each a way the file can be wrong."""
    table = marshal.loads(good)
    key = seccomp_cache.key(False, True, seccomp_cache.library_facts())
    allow_all = b"\x06\x00\x00\x00\x00\x00\xff\x7f"      # BPF_RET SECCOMP_RET_ALLOW
    made = {}

    def put(name: str, data: bytes, mode: int = 0o644) -> Path:
        path = tmp_path / name
        path.write_bytes(data)
        path.chmod(mode)
        made[name] = path
        return path

    put("garbage", b"not marshal at all \x00\xff")
    put("empty", b"")
    put("cut", good[: len(good) // 2])
    put("a list", marshal.dumps(list(table.values())))
    put("not bytes", marshal.dumps({key: "a string"}))
    put("no program", marshal.dumps({key: b""}))
    put("half an instruction", marshal.dumps({key: allow_all + b"\x00\x00\x00"}))
    # A permissive program under the right key, in a file the code's owner
    # did not keep to itself: never used.
    put("group-writable", marshal.dumps({**table, key: allow_all}), 0o664)
    put("world-writable", marshal.dumps({**table, key: allow_all}), 0o646)
    link = tmp_path / "a symlink"
    link.symlink_to(put("target", good))
    made["a symlink"] = link
    fifo = tmp_path / "a fifo"
    os.mkfifo(fifo, 0o644)
    made["a fifo"] = fifo
    (tmp_path / "a directory").mkdir()
    made["a directory"] = tmp_path / "a directory"
    made["missing"] = tmp_path / "missing"
    if os.geteuid() == 0:
        foreign = put("another user's", marshal.dumps({**table, key: allow_all}))
        os.chown(foreign, 65534, 65534)
    del made["target"]
    return made


def test_a_bad_cache_is_never_used_and_never_stops_a_run(cache, tmp_path, monkeypatch):
    bad = tmp_path / "bad"
    bad.mkdir()
    expected = _libseccomps(False, True)
    for name, path in _bad_caches(bad, cache.read_bytes()).items():
        assert seccomp_cache.cached_bpf(False, True, str(path)) is None, name
        monkeypatch.setattr(seccomp_cache, "FILE", str(path))
        monkeypatch.setattr(seal, "_supervised", lambda unix: True)
        assert seal._before_the_plan(False).seccomp_bpf == expected, name
    # Control: the good cache, in the same directory, is used.
    assert seccomp_cache.cached_bpf(False, True, str(cache)) == expected


@pytest.mark.world
def test_a_run_takes_its_filter_from_the_installed_cache(world, user):
    """A real run (every import of every process seen by an audit hook): the
    helper reaches Ready without importing pyseccomp, for root and for
    vpnwtest (who can read the cache, and not write it). Control: the
    installed cache is there and has the program for this run's rules, and
    the helper imported the cache's module."""
    installed = Path(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                     "site-packages", "stages", "helper", "seccomp_filters.marshal")
    assert installed.is_file(), "scripts/setup writes the cache"
    assert not installed.stat().st_mode & 0o022
    work = world.workdir(user)
    at, loaded = audited_run(world, user, work, ["run", "--record", str(work / "run.jsonl"), "--", "true"])
    ready, helper_pid = at[("helper", "Ready sent")]
    helpers = {name for ns, pid, name in loaded if pid == helper_pid and ns < ready}
    assert "stages.helper.seccomp_cache" in helpers      # control
    assert "pyseccomp" not in helpers

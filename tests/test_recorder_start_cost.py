"""What the recorder of a signed run does on its way to run.start, which the
program waits for (docs/architecture.md, "Start-up budget"): libsodium and
fallocate(2) through stages/kernel/foreign.py (ctypes' own types: calling
through `_ctypes` alone bought under 1 ms, stages/startup/tricks.py), no
`base64` or text codec imported, and `printable`'s pattern
compiled only for a text that needs it; each the same as what it replaces."""
from __future__ import annotations

import base64
import binascii
import ctypes
import errno
import json
import os
import subprocess
import sys

import pytest

from e2e_support import audited_run
from progs_support import prog_text
from stages.kernel import foreign
from stages.record import signing, text

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def test_the_foreign_types_are_ctypes_own():
    """Each type has ctypes' size and converts a Python value as ctypes'
    does (the same `_type_` code, so the same C conversion)."""
    pairs = [(foreign.c_int, ctypes.c_int), (foreign.c_long, ctypes.c_long),
             (foreign.c_int64, ctypes.c_int64), (foreign.c_ulonglong, ctypes.c_ulonglong),
             (foreign.c_size_t, ctypes.c_size_t), (foreign.c_void_p, ctypes.c_void_p),
             (foreign.c_char_p, ctypes.c_char_p), (foreign.c_char, ctypes.c_char)]
    for ours, theirs in pairs:
        assert ctypes.sizeof(ours) == ctypes.sizeof(theirs), ours
        assert ours._type_ == theirs._type_, ours
    assert foreign.c_int(-5).value == -5 and foreign.c_ulonglong(2 ** 64 - 1).value == 2 ** 64 - 1
    buffer = foreign.buffer(8)
    assert buffer.raw == b"\0" * 8 and len(buffer) == 8


def test_a_libc_call_through_foreign_returns_and_sets_errno_as_ctypes():
    libc = foreign.Library(None, use_errno=True)
    strlen = libc.function("strlen", (foreign.c_char_p,), restype=foreign.c_size_t)
    assert strlen(b"vpnw") == 4
    fallocate = libc.function("fallocate", (foreign.c_int, foreign.c_int, foreign.c_int64,
                                            foreign.c_int64))
    assert fallocate(-1, 1, 0, 4096) == -1
    assert foreign.get_errno() == errno.EBADF
    theirs = ctypes.CDLL(None, use_errno=True).fallocate
    theirs.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    assert theirs(-1, 1, 0, 4096) == -1 and ctypes.get_errno() == errno.EBADF
    with pytest.raises(AttributeError):
        libc.function("no_such_function_in_libc", ())
    with pytest.raises(OSError):
        foreign.Library("libno-such-library-vpnw.so.0")


def test_the_fast_base64_is_base64s():
    samples = [os.urandom(n) for n in range(0, 80)] + [b"\0" * 74, b"\xff" * 42]
    for data in samples:
        assert signing._b64(data) == base64.b64encode(data).decode()
        assert signing._unb64(signing._b64(data)) == data
    bad = ["RWQ", "RWQ=x", "RW Q=", "R*Q=", "RWQ==", "RWQ\u00e9", "=RWQ", "RWQ=="]
    for line in bad:
        try:
            expected = base64.b64decode(line, validate=True)
        except ValueError:
            expected = ValueError
        try:
            ours = signing._unb64(line)
        except ValueError:
            ours = ValueError
        assert ours == expected, line


def test_printable_is_the_pattern_on_every_character_and_compiles_it_only_when_needed():
    pattern = __import__("re").compile(text._UNPRINTABLE)

    def by_the_pattern(value: str) -> str:
        return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                           else f"\\u{ord(m.group()):04x}", value)
    for code in range(0x3000):
        ch = chr(code)
        for value in (ch, f"a{ch}b", f"{ch}{ch}"):
            assert text.printable(value) == by_the_pattern(value), hex(code)
    assert text.printable(42) == "42" and text.printable("évil\x1b[2J") == "évil\\x1b[2J"
    fresh = subprocess.run([sys.executable, "-c",
                            "from stages.record import text\n"
                            "a = text.printable('api.example.com:443'), text._unprintable\n"
                            "b = text.printable('x\\x1b'), text._unprintable is not None\n"
                            "print(a[0], a[1], b[0].encode('unicode_escape').decode(), b[1])"],
                           env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                           check=True)
    assert fresh.stdout.split() == ["api.example.com:443", "None", "x\\\\x1b", "True"]


def test_a_fifo_at_the_public_keys_name_does_not_hold_the_run(tmp_path):
    """The public half is compared as bytes read without waiting: a FIFO put
    at run-signing.pub is replaced by the key's public half, where a text
    stream opened on it waited for a writer that never comes."""
    keys = tmp_path / "keys"
    key = signing.load_secret(str(keys))
    os.mkfifo(keys / signing.PUBLIC_NAME)
    code = ("import sys\nfrom stages.record import signing\n"
            f"key = signing.load_secret({str(keys)!r}, create=False)\n"
            "print(signing.public_key_file(key))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    public = keys / signing.PUBLIC_NAME
    assert public.is_file() and public.read_text() == key.public().minisign_text()
    assert signing.load_public(str(public)) == key.public()


# What the recorder loads in a fork of vpnw (the record's modules loaded, as
# run.py has them at the fork) to open the key and the ledger and reserve the
# room of a run file: the modules it adds, as a JSON list.
RECORDER_OPENS = prog_text("recorder_opens.py")


def test_the_recorder_opens_a_signed_run_without_base64_or_a_codec(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "XDG_STATE_HOME": str(tmp_path / "state")}
    out = subprocess.run([sys.executable, "-c", RECORDER_OPENS, str(tmp_path / "run.jsonl")],
                         env=env, capture_output=True, text=True, check=True, cwd=tmp_path)
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert {"_ctypes", "stages.kernel.foreign", "stages.record.sodium",
            "stages.recorder.reserve"} <= loaded                       # control
    assert not {"base64", "encodings.ascii"} & loaded
    # No --events-to and no --syslog: no copy's feeder (and select) either.
    assert not {"stages.recorder.feeder", "select"} & loaded


@pytest.mark.world
def test_a_signed_runs_recorder_reaches_run_start_without_base64(world, user):
    """A real signed run, every import of every process seen: the recorder,
    by "run.start written", loaded libsodium's and fallocate's way in
    (`_ctypes`, foreign, sodium) and not `base64` or a text codec;
    and the run it signed verifies. Control: the modules it did load
    (the check sees a module where there is one)."""
    work = world.workdir(user)
    record = work / "signed-start.jsonl"
    at, imported = audited_run(world, user, work, ["run", "--record", str(record), "--", "true"])
    written, recorder = at[("recorder", "run.start written")]
    by_run_start = {name for ns, pid, name in imported if pid == recorder and ns <= written}
    assert {"_ctypes", "stages.kernel.foreign", "stages.record.sodium"} <= by_run_start  # control
    assert not {"base64", "encodings.ascii"} & by_run_start
    # The run's own state home (world.state_home numbers each fresh one): its key and ledger.
    state = max(world.tmp.glob(f"state-{user}-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    shown = world.vpnw(["show", "--verify", str(record)], user=user, state_home=state)
    assert shown.returncode == 0, shown
    assert "signature: good" in shown.stdout, shown

"""Evidence that holds after the run (issue 30), through real runs, as root
and as vpnwtest: each run file signed at its end with a key the program
never sees, checked by a stock tool (Debian's minisign) and by
`vpnw show --verify`; a chained ledger of runs that shows a run deleted or
replaced whole, and its own cuts; a key that cannot be used stops the run
before the program exists; a rotated key's runs still verify with its
public half (docs/record.md, "The signed end", "The ledger";
docs/security.md says against whom each layer holds).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from e2e_support import describe, openat2_ops, owner, runs_in
from progs_support import prog_text
from stages.record.chain import Chain, unchained, verify

pytestmark = pytest.mark.world

CURL_TWO = ["sh", "-c", "curl -sS --max-time 30 -o /dev/null http://api.github.com/whoami && "
                        "curl -sS --max-time 30 -o /dev/null http://pypi.world/whoami"]


def keys(state: Path) -> Path:
    return state / "vpnw" / "keys"


def rechain(data: bytes) -> bytes:
    """What someone who read docs/record.md can do: recompute every digest."""
    chain = Chain()
    return b"".join(chain.seal(unchained(line)) + b"\n" for line in data.splitlines())


def overwrite(path: Path, data: bytes) -> None:
    """Rewrite a file in place, as its owner would (ownership and mode kept)."""
    with open(path, "r+b") as out:
        out.write(data)
        out.truncate()


class Runs:
    """vpnw runs of one user sharing one state directory."""

    def __init__(self, world, user: str):
        self.world, self.user = world, user
        self.state = world.state_home(user)
        self.work = world.workdir(user)

    def vpnw(self, *args, **kw):
        return self.world.vpnw(list(args), user=self.user, state_home=self.state, **kw)

    def trace(self, *program) -> Path:
        before = set(runs_in(self.state))
        r = self.vpnw("trace", "--", *(program or ("true",)))
        assert r.returncode == 0, describe(r)
        [new] = set(runs_in(self.state)) - before
        return new

    def verify(self, *args):
        return self.vpnw("show", "--verify", *map(str, args))

    def run_as_user(self, argv, **kw):
        return self.world.run(argv, user=self.user, state_home=self.state, **kw)

    def ledger(self) -> list[dict]:
        return [json.loads(line) for line in (self.state / "vpnw" / "ledger.jsonl").read_bytes().splitlines()]


@pytest.fixture
def runs(world, user) -> Runs:
    return Runs(world, user)


def key_id(public_key_text: str) -> str:
    # "untrusted comment: minisign public key <ID>"
    return public_key_text.splitlines()[0].split()[-1]


def lines_of(r) -> list[str]:
    return r.stdout.splitlines()


def test_a_run_is_signed_and_minisign_checks_it(runs):
    path = runs.trace(*CURL_TWO)
    events = [json.loads(line) for line in path.read_bytes().splitlines()]
    run_id, last = events[0]["run"], events[-1]["d"]
    sig = Path(f"{path}.minisig")
    assert sig.is_file() and sig.stat().st_mode & 0o777 == 0o600
    secret = keys(runs.state) / "run-signing.key"
    assert keys(runs.state).stat().st_mode & 0o777 == 0o700
    assert secret.stat().st_mode & 0o777 == 0o600
    assert (secret.stat().st_uid, secret.stat().st_gid) == owner(runs.user)

    # `vpnw key` prints the public key; pinned elsewhere, a stock tool checks the run with it.
    k = runs.vpnw("key")
    assert k.returncode == 0, describe(k)
    assert k.stdout.startswith("untrusted comment: minisign public key ") and len(lines_of(k)) == 2
    assert k.stdout == (keys(runs.state) / "run-signing.pub").read_text()
    pinned = runs.work / "vpnw.pub"
    pinned.write_text(k.stdout)
    m = runs.run_as_user(["minisign", "-V", "-p", str(pinned), "-m", str(path)])
    assert m.returncode == 0, describe(m)
    assert lines_of(m) == [
        "Signature and comment signature verified",
        f"Trusted comment: vpnw run={run_id} end=run.end lines={len(events)} exit=0 connections=2 "
        f"denied=0 would_deny=0 failed=0 digest={last} ledger=1 prev=-"]

    v = runs.verify()
    assert v.returncode == 0, describe(v)
    chain, signature, ledger = lines_of(v)
    assert chain.endswith(f"last digest {last}")
    assert signature.startswith(f"signature: good: signed by key {key_id(k.stdout)} ({sig})")
    assert ledger.startswith(f"ledger: entry 1 of 1 in {runs.state}/vpnw/ledger.jsonl agrees")
    [entry] = runs.ledger()
    assert {k: entry[k] for k in ("seq", "run", "file", "lines", "digest")} == {
        "seq": 1, "run": run_id, "file": str(path), "lines": len(events), "digest": last}
    assert entry["sig"] == sig.read_text()
    assert (runs.state / "vpnw" / "ledger.jsonl").stat().st_mode & 0o777 == 0o600


def test_a_rewritten_and_rechained_run_fails_on_its_signature(runs):
    path = runs.trace(*CURL_TWO)
    forged = rechain(path.read_bytes().replace(b'"api.github.com"', b'"pypi.org"'))
    # Control: the chain alone is whole again, which is all --verify checked before.
    assert verify(forged.splitlines(keepends=True)).status == "whole"
    overwrite(path, forged)

    v = runs.verify(path)
    assert v.returncode == 1, describe(v)
    chain, signature, ledger = lines_of(v)
    assert "whole and unaltered" in chain
    assert signature == (f"signature: FAILED: {path}.minisig: the signature does not match the file: "
                         "it was changed after it was signed")
    assert ledger.startswith("ledger: FAILED: entry 1 of ") and ledger.endswith("it was replaced or rewritten")
    m = runs.run_as_user(["minisign", "-V", "-p", str(keys(runs.state) / "run-signing.pub"), "-m", str(path)])
    assert m.returncode == 1 and "Signature verification failed" in m.stderr, describe(m)

    # What reads the file says so, in one line, and still does its work.
    warning = (f"vpnw: warning: {path} does not verify (signature, ledger failed): what it says may not "
               f"be what happened; `vpnw show --verify {path}` says where")
    for args in (["show"], ["show", "--summary"], ["learn"]):
        r = runs.vpnw(*args)
        assert r.returncode == 0, describe(r)
        said = [line for line in r.stderr.splitlines() if line.startswith("vpnw: warning:")]
        assert said == [warning], (args, r.stderr)
        assert "pypi.org" in r.stdout, (args, r.stdout)


def test_a_run_replaced_or_deleted_whole_shows(runs):
    first, second, third = runs.trace(), runs.trace(*CURL_TWO), runs.trace()
    ids = [json.loads(p.read_bytes().splitlines()[0])["run"] for p in (first, second, third)]
    # The first run's file and signature replaced by the second's: each is genuine.
    shutil.copyfile(second, first)
    shutil.copyfile(f"{second}.minisig", f"{first}.minisig")
    v = runs.verify(first)
    assert v.returncode == 1, describe(v)
    chain, signature, ledger = lines_of(v)
    assert "whole and unaltered" in chain and signature.startswith("signature: good:")
    assert ledger.startswith(f"ledger: FAILED: entry 1 of {runs.state}/vpnw/ledger.jsonl says {first} "
                             f"held run {ids[0]} ending in digest ")
    assert f"this file holds run {ids[1]} ending in " in ledger and ledger.endswith("it was replaced or rewritten")

    # The second run deleted whole (with its signature).
    os.unlink(second)
    os.unlink(f"{second}.minisig")
    listing = {line.split()[0] + " " + line.split()[-1] for line in lines_of(runs.vpnw("runs"))[1:]}
    assert listing == {f"{ids[1]} CHANGED", f"{ids[1]} MISSING", f"{ids[2]} ok"}, listing
    v = runs.verify(third)
    assert v.returncode == 1, describe(v)
    assert lines_of(v)[1].startswith("signature: good:") and lines_of(v)[2].startswith("ledger: entry 3 of 3")
    assert lines_of(v)[3] == (f"runs: FAILED: in {runs.state}/vpnw/ledger.jsonl, gone from {third.parent}: "
                              f"{ids[1]} (entry 2): deleted or moved away")
    # show and learn read only the third, which is whole: no warning.
    assert "warning" not in runs.vpnw("show", str(third)).stderr


def test_a_cut_or_edited_ledger_shows(runs):
    made = [runs.trace() for _ in range(3)]
    book = runs.state / "vpnw" / "ledger.jsonl"
    whole = book.read_bytes()
    lines = whole.splitlines(keepends=True)

    overwrite(book, b"".join(lines[:2]))       # the last entry cut off
    v = runs.verify(made[2])
    assert v.returncode == 1, describe(v)
    assert lines_of(v)[2] == (f"ledger: FAILED: the run was entered as entry 3 of {book}, which is "
                              "missing (the ledger was cut or replaced)")
    assert runs.verify(made[1]).returncode == 0

    overwrite(book, whole[:-10])              # cut inside its last line
    v = runs.verify(made[0])
    assert v.returncode == 1 and lines_of(v)[2] == f"ledger: FAILED: {book}: line 3 is cut: the file ends inside it", v.stdout

    # The middle entry removed, the rest renumbered and the chain recomputed.
    entries = [json.loads(line) for line in lines]
    del entries[1]
    chain = Chain()
    forged = b""
    for seq, entry in enumerate(entries, 1):
        entry["seq"] = seq
        entry.pop("d")
        forged += chain.seal(json.dumps(entry, separators=(",", ":")).encode()) + b"\n"
    overwrite(book, forged)
    v = runs.verify(made[0])
    assert v.returncode == 1, describe(v)
    assert lines_of(v)[2].startswith(f"ledger: FAILED: {book}: line 2 (run ") and \
        lines_of(v)[2].endswith("was signed as entry 3 after another head: lines before it were removed, "
                                "added or rewritten"), v.stdout

    book.unlink()                              # the ledger gone
    v = runs.verify(made[2])
    assert v.returncode == 1 and lines_of(v)[2] == (
        f"ledger: FAILED: the run was entered as entry 3 of {book}, which is missing: the ledger itself "
        "is gone (the ledger was cut or replaced)"), v.stdout


@pytest.mark.parametrize("case", ["unreadable", "a directory", "a symlink loop", "a fifo", "not a key"])
def test_a_key_that_cannot_be_used_stops_the_run_before_the_program(runs, case):
    runs.trace()                               # makes the key
    secret = keys(runs.state) / "run-signing.key"
    if case == "unreadable":
        if runs.user == "root":
            pytest.skip("root reads a file of mode 000 (CAP_DAC_OVERRIDE): the symlink loop covers root")
        secret.chmod(0)
        why = f"cannot read the vpnw signing key {secret}: Permission denied"
    elif case == "a directory":
        secret.unlink()
        secret.mkdir()
        why = f"cannot read the vpnw signing key {secret}: Is a directory"
    elif case == "a symlink loop":             # unreadable for root too
        secret.unlink()
        secret.symlink_to(secret.name)
        why = f"cannot read the vpnw signing key {secret}: Too many levels of symbolic links"
    elif case == "a fifo":                     # opened for reading, it would hold the run forever
        secret.unlink()
        os.mkfifo(secret, 0o600)
        os.chown(secret, *owner(runs.user))
        why = f"cannot read the vpnw signing key {secret}: not a regular file"
    else:
        overwrite(secret, b"untrusted comment: hello\nnot base64 at all\n")
        why = f"{secret} is not a vpnw signing key: its second line is not base64"
    marker = runs.work / "the-program-ran"
    r = runs.vpnw("run", "--", "touch", str(marker))
    assert r.returncode == 125, describe(r)
    assert why in r.stderr, r.stderr
    assert "fix: make it readable by you, or move it away and vpnw makes a new key" in r.stderr
    assert "a run that cannot be signed is not run: the program was not run" in r.stderr
    assert not marker.exists()


def test_a_missing_key_is_made_and_a_rotated_one_still_checks_its_runs(runs):
    old_run = runs.trace(*CURL_TWO)
    old_pub = runs.vpnw("key").stdout
    old_id = key_id(old_pub)
    # Rotation: a new key; the old public half kept beside it.
    r = runs.vpnw("key", "--rotate")
    assert r.returncode == 0, describe(r)
    kept = keys(runs.state) / f"run-signing-{old_id}.pub"
    assert kept.read_text() == old_pub and f"the old key's public half is kept as {kept}" in r.stderr
    new_id = key_id(r.stdout)
    assert new_id != old_id and r.stdout == (keys(runs.state) / "run-signing.pub").read_text()
    new_run = runs.trace()
    assert runs.verify(new_run).returncode == 0

    v = runs.verify(old_run)
    assert v.returncode == 2, describe(v)
    assert lines_of(v)[1] == (f"signature: not checked: signed by key {old_id}, not by {new_id}: give key "
                              f"{old_id}'s public key with --key FILE (a key rotated away, or another machine's)")
    v = runs.verify("--key", kept, old_run)
    assert v.returncode == 0, describe(v)
    assert lines_of(v)[1].startswith(f"signature: good: signed by key {old_id}")
    m = runs.run_as_user(["minisign", "-V", "-p", str(kept), "-m", str(old_run)])
    assert m.returncode == 0, describe(m)

    # The secret key removed: the next run makes a new one, and says nothing is wrong.
    (keys(runs.state) / "run-signing.key").unlink()
    third = runs.trace()
    assert runs.verify(third).returncode == 0
    assert key_id(runs.vpnw("key").stdout) not in (old_id, new_id)

    # A public key that is not the signer's: another key (2), or a forged one
    # under the signer's key id (1); a file that is not a key (121).
    other = runs.work / "other"
    g = runs.run_as_user(["minisign", "-G", "-W", "-p", f"{other}.pub", "-s", f"{other}.key"])
    assert g.returncode == 0, describe(g)
    assert runs.verify("--key", f"{other}.pub", third).returncode == 2
    forged = runs.work / "forged.pub"
    import base64
    blob = base64.b64decode(Path(f"{other}.pub").read_text().splitlines()[1])
    mine = base64.b64decode((keys(runs.state) / "run-signing.pub").read_text().splitlines()[1])
    forged.write_text("untrusted comment: forged\n" + base64.b64encode(mine[:10] + blob[10:]).decode() + "\n")
    v = runs.verify("--key", forged, third)
    assert v.returncode == 1 and "the signature does not match the file" in v.stdout, describe(v)
    v = runs.verify("--key", old_run, third)
    assert v.returncode == 121 and "is not a minisign public key" in v.stderr, describe(v)


# Every way to read the key from inside (the file-limits tests' ways): by
# name, through /proc/self/root and /proc/1/root, relative to a cwd inside
# the key directory, by listing the directory, and by walking the whole
# state directory for the key's bytes. Prints {attempt: "ok:<what>" | errno}.
READ_THE_KEY = prog_text("read_the_key.py")


def test_the_program_cannot_read_the_key(runs):
    runs.trace()
    secret = (keys(runs.state) / "run-signing.key").read_text().splitlines()[1]
    attack = runs.world.file("read_the_key.py", READ_THE_KEY)
    argv = [sys.executable, str(attack), str(keys(runs.state)), str(runs.state), secret]
    r = runs.vpnw("run", "--", *argv, cwd=keys(runs.state))
    assert r.returncode == 0, describe(r)
    inside = json.loads(r.stdout)
    # init (PID 1) is not dumpable: its /proc root is refused before any look-up.
    assert inside.pop("via-proc-1-root") in ("ENOENT", "EACCES"), inside
    # A device node opened from a user namespace: refused by the kernel, root included.
    assert inside.pop("raw-device") in ("EPERM", "EACCES", "ENOENT"), inside
    assert inside == {"open": "ENOENT", "via-proc-self-root": "ENOENT", "relative-to-cwd": "ENOENT",
                      "list-keys": "ok:", "list-cwd": "ok:", "walk-state": "ok:"}, inside
    # Control: the same attempts outside vpnw find the key.
    control = runs.run_as_user(argv, cwd=keys(runs.state))
    assert control.returncode == 0, describe(control)
    outside = json.loads(control.stdout)
    assert outside["open"] == outside["via-proc-self-root"] == outside["relative-to-cwd"] == "ok:key"
    assert "run-signing.key" in outside["list-keys"] and outside["walk-state"] == "ok:run-signing.key"
    # The run itself was signed with it: the recorder, outside, read it.
    assert runs.verify().returncode == 0


def libsodium_file() -> str:
    """The file this machine's libsodium is loaded from (the soname vpnw asks for)."""
    import ctypes
    from stages.record import sodium
    ctypes.CDLL(sodium.SONAME)
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libsodium" in line:
                return line.split()[-1]
    raise AssertionError("libsodium is not mapped after loading it")


def without_libsodium(runs, *args, cwd=None):
    """vpnw as on a machine without libsodium: in a mount namespace of its
    own (inside the world's) where the library's file is an empty one, so
    loading it fails as a missing library does ("file too short")."""
    import subprocess
    empty = runs.world.file("empty-library.so", b"")
    argv, _ = runs.world.command([str(runs.world.vpnw_path), *map(str, args)], user=runs.user,
                                 state_home=runs.state, cwd=cwd)
    at = argv.index("--") + 1          # after `nsenter ... --`, before the drop to the user
    argv[at:at] = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                   'mount --bind "$0" "$1" && shift && exec "$@"', str(empty), libsodium_file()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_without_libsodium_a_signed_run_stops_before_the_program(runs):
    signed = runs.trace()                       # control: with the library, a run is signed
    assert runs.verify(signed).returncode == 0
    marker = runs.work / "the-program-ran"
    r = without_libsodium(runs, "run", "--", "touch", marker)
    assert r.returncode == 125, describe(r)
    assert ("libsodium, which signs vpnw's runs, cannot be loaded (" in r.stderr
            and "fix: install it (Debian: apt-get install libsodium23; scripts/setup does); a run that "
                "cannot be signed is not run: the program was not run" in r.stderr), r.stderr
    assert not marker.exists()
    assert runs_in(runs.state)[-1] == signed or not runs_in(runs.state)[-1].read_bytes(), \
        "a run file with events was left by a run that never started"

    # What needs no signature still works without it: a record to stdout.
    r = without_libsodium(runs, "run", "--record", "-", "--", "touch", marker)
    assert r.returncode == 0 and marker.exists(), describe(r)
    # --verify cannot check a signature: unproven (2), never whole (0); the chain still is.
    v = without_libsodium(runs, "show", "--verify", signed)
    assert v.returncode == 2, describe(v)
    chain, signature, ledger = v.stdout.splitlines()
    assert "whole and unaltered" in chain
    assert signature.startswith(f"signature: not checked: {signed}.minisig: signed by key ")
    assert "; libsodium, which signs vpnw's runs, cannot be loaded (" in signature
    assert ledger.startswith("ledger: not checked: entry 1 of ") and \
        "names this run, but its signature cannot be checked: libsodium" in ledger
    k = without_libsodium(runs, "key")
    assert k.returncode == 125 and "apt-get install libsodium23" in k.stderr, describe(k)


def test_a_key_swapped_for_another_shows_against_the_pinned_public_key(runs):
    """Someone with the user's rights puts a key of their own in place of
    vpnw's: runs then verify with the machine's key (it is theirs now), and
    fail against the public key pinned elsewhere, under a new key id (2) or
    under the old one forged (1), with vpnw and with minisign."""
    import base64
    runs.trace()
    pinned = runs.work / "pinned.pub"
    pinned.write_text(runs.vpnw("key").stdout)
    secret = keys(runs.state) / "run-signing.key"
    old = base64.b64decode(secret.read_text().splitlines()[1])
    for key_id, want in ((os.urandom(8), 2), (old[2:10], 1)):
        overwrite(secret, b"untrusted comment: swapped\n"
                  + base64.b64encode(b"Ed" + key_id + os.urandom(32)) + b"\n")
        run = runs.trace()
        assert runs.verify(run).returncode == 0          # the machine's key is the swapped one now
        v = runs.verify("--key", pinned, run)
        assert v.returncode == want, describe(v)
        m = runs.run_as_user(["minisign", "-V", "-p", str(pinned), "-m", str(run)])
        assert m.returncode == 1, describe(m)


def test_a_fifo_in_place_of_a_signature_or_the_ledger_holds_nothing(runs):
    """A FIFO where a .minisig or the ledger should be: read, it would wait
    for a writer forever; vpnw reads only regular files there."""
    run = runs.trace()
    sig = Path(f"{run}.minisig")
    kept = sig.read_bytes()
    sig.unlink()
    os.mkfifo(sig, 0o600)
    os.chown(sig, *owner(runs.user))
    v = runs.verify(run)                  # the ledger holds the same signature
    assert v.returncode == 0 and "signature: good: " in v.stdout and "(the ledger's entry 1)" in v.stdout, \
        describe(v)
    sig.unlink()
    sig.write_bytes(kept)

    book = runs.state / "vpnw" / "ledger.jsonl"
    book.unlink()
    os.mkfifo(book, 0o600)
    os.chown(book, *owner(runs.user))
    v = runs.verify(run)
    assert v.returncode == 1 and lines_of(v)[2] == f"ledger: FAILED: {book}: not a regular file (the ledger " \
                                                   "was replaced)", describe(v)
    marker = runs.work / "the-program-ran"
    r = runs.vpnw("run", "--", "touch", marker)
    assert r.returncode == 125 and f"cannot write the ledger of runs {book}: " in r.stderr, describe(r)
    assert not marker.exists()


def test_a_link_planted_at_the_signatures_name_is_replaced_never_written_through(runs):
    """The program links a file of the user's at its record's .minisig name
    (the record's directory is the user's, writable inside). The signature
    goes into a new file at that name: the linked file keeps its content,
    and the run checks. Failed before: the .minisig was truncated in place,
    through the link (on ext4 that also costs a write-back when it is
    closed, 0.5-4 ms on the way to vpnw's exit)."""
    notes = runs.work / "signed-end-notes.txt"
    record = runs.work / "signed-end-planted.jsonl"
    sig = Path(f"{record}.minisig")
    notes.write_text("the user's own\n")
    os.chown(notes, *owner(runs.user))
    try:
        r = runs.vpnw("run", "--record", str(record), "--", "ln", str(notes), str(sig))
        assert r.returncode == 0, describe(r)
        assert notes.read_text() == "the user's own\n" and notes.stat().st_nlink == 1
        assert sig.read_text().startswith("untrusted comment: ")
        v = runs.verify(record)
        assert v.returncode == 0 and "signature: good: " in v.stdout, describe(v)
    finally:
        for made in (notes, record, sig):
            made.unlink(missing_ok=True)


def test_the_room_reserved_for_the_record_is_given_back_before_vpnw_exits(runs):
    """While the program runs, its record holds room reserved past its end
    (docs/security.md, "A full disk hides nothing"); by the time vpnw has
    exited that room is given back and the run is signed. The recorder gives
    it back while it signs, in a thread of its own that it waits for before
    it exits: this pins that both are done before vpnw's exit."""
    record = runs.work / "signed-end-room.jsonl"
    try:
        r = runs.vpnw("run", "--record", str(record), "--", "stat", "-c", "%b %B", str(record))
        assert r.returncode == 0, describe(r)
        blocks, unit = map(int, r.stdout.split())
        assert blocks * unit >= 1 << 20, f"no room reserved while the program ran (control): {r.stdout}"
        after = record.stat()
        assert after.st_blocks * 512 < 64 << 10 and after.st_size > 0, (after.st_blocks, after.st_size)
        v = runs.verify(record)
        assert v.returncode == 0 and "signature: good: " in v.stdout, describe(v)
    finally:
        for made in (record, Path(f"{record}.minisig")):
            made.unlink(missing_ok=True)


def test_a_signature_stripped_leaves_the_file_unproven_never_whole(runs):
    """Why a whole chain with no signature is 2, not 0 (docs/record.md): a
    rewritten, rechained file whose .minisig is removed and whose ledger line
    is cut (it was the last) must not pass for whole."""
    path = runs.trace(*CURL_TWO)
    overwrite(path, rechain(path.read_bytes().replace(b'"api.github.com"', b'"pypi.org"')))
    Path(f"{path}.minisig").unlink()
    book = runs.state / "vpnw" / "ledger.jsonl"
    overwrite(book, b"")
    v = runs.verify(path)
    assert v.returncode == 2, describe(v)
    chain, signature, ledger = lines_of(v)
    assert "whole and unaltered" in chain
    assert signature.startswith("signature: not checked: none: no .minisig beside the file and no entry")
    assert ledger == f"ledger: not checked: no entry for this run in {book}"


def test_a_record_kept_elsewhere_is_checked_by_its_own_layers(runs):
    """A --record file outside the runs folder: signed and in the ledger like
    any run; moved, it still verifies (its ledger entry found by run id);
    replaced, it fails. A file gone from that directory is the user's
    business there, not a failure of the files beside it: only the runs
    folder is checked for runs gone (as `vpnw runs` lists it)."""
    work, other = runs.world.workdir(runs.user), runs.world.workdir(runs.user)
    made = []
    for name in ("a.jsonl", "b.jsonl"):
        r = runs.vpnw("trace", "--record", work / name, "--", "true")
        assert r.returncode == 0, describe(r)
        made.append(work / name)
    a, b = made
    assert runs.verify(a).returncode == 0 and Path(f"{a}.minisig").is_file()
    entries = runs.ledger()
    assert [e["file"] for e in entries] == [str(a), str(b)]

    moved = other / "moved.jsonl"
    os.rename(a, moved)                   # its .minisig left behind: the ledger has the signature
    v = runs.verify(moved)
    assert v.returncode == 0, describe(v)
    assert lines_of(v)[1].startswith("signature: good: ") and "(the ledger's entry 1)" in lines_of(v)[1]
    assert lines_of(v)[2].startswith("ledger: entry 1 of 2 ") and lines_of(v)[2].endswith(
        f"agrees, recorded as {a}; the ledger's chain is whole")
    v = runs.verify(b)                    # a.jsonl gone from beside it says nothing of b
    assert v.returncode == 0 and len(lines_of(v)) == 3, describe(v)

    shutil.copyfile(moved, b)             # b replaced by a's file (b's .minisig still beside it)
    v = runs.verify(b)
    assert v.returncode == 1, describe(v)
    assert lines_of(v)[1] == (f"signature: FAILED: {b}.minisig: the signature does not match the file: "
                              "it was changed after it was signed")
    assert lines_of(v)[2].endswith("it was replaced or rewritten")
    listing = runs.vpnw("runs")
    assert "MISSING" not in listing.stdout and "no runs recorded" in listing.stderr, describe(listing)


# ── the key, however the program reaches for it ─────────────────────────────
# The file-limits tests' ways (tests/test_e2e_files.py) aimed at vpnw's key,
# beyond the name, /proc roots, cwd, listing, walk and raw device above.

PROBE = Path(__file__).resolve().parent / "progs" / "file_probe.py"


def key_reach_ops(keys_dir: Path, work: Path) -> list[dict]:
    key = f"{keys_dir}/run-signing.key"
    vpnw_dir = keys_dir.parent
    return [
        {"name": "symlink_make", "op": "symlink", "target": key, "path": f"{work}/lnk"},
        {"name": "symlink_read", "op": "read", "path": f"{work}/lnk"},
        {"name": "hardlink", "op": "link", "src": key, "path": f"{work}/hard"},
        {"name": "dotdot", "op": "read", "path": f"{keys_dir}/../keys/./run-signing.key"},
        {"name": "proc_cwd", "op": "proc_cwd", "dir": str(keys_dir), "rel": "run-signing.key"},
        *openat2_ops(str(vpnw_dir), "keys/run-signing.key", key),
        {"name": "umount", "op": "umount", "path": str(keys_dir)},
        {"name": "remount_rw", "op": "remount_rw", "path": str(keys_dir)},
        {"name": "mount_tmpfs", "op": "mount_tmpfs", "path": str(keys_dir)},
        {"name": "bind_out", "op": "bind", "src": str(keys_dir), "path": f"{work}/b"},
        {"name": "unshare_mount", "op": "unshare_mount", "path": str(keys_dir)},
        {"name": "read_after", "op": "read", "path": key},
    ]


def probe_key(runs, ops: list[dict], *, inside: bool, cwd: Path) -> dict[str, dict]:
    probe = runs.world.file("file_probe.py", PROBE.read_bytes())
    argv = [runs.world.python, str(probe), json.dumps(ops)]
    r = runs.vpnw("run", "--", *argv, cwd=cwd) if inside else runs.run_as_user(argv, cwd=cwd)
    assert r.returncode == 0, describe(r)
    results = {json.loads(line)["op"]: json.loads(line) for line in r.stdout.splitlines()}
    assert set(results) == {op["name"] for op in ops}, describe(r)
    return results


def test_the_program_cannot_reach_the_key_the_ways_the_file_limits_tests_try(runs):
    runs.trace()
    secret = (keys(runs.state) / "run-signing.key").read_text().splitlines()[1]
    work_in, work_out = runs.world.workdir(runs.user), runs.world.workdir(runs.user)
    for work in (work_in, work_out):
        (work / "b").mkdir()
        os.chown(work / "b", *owner(runs.user))
    inside = probe_key(runs, key_reach_ops(keys(runs.state), work_in), inside=True, cwd=work_in)
    accepted = {
        "symlink_make": {"ok"}, "symlink_read": {"ENOENT"}, "hardlink": {"ENOENT"}, "dotdot": {"ENOENT"},
        "proc_cwd": {"ENOENT"}, "openat2_beneath": {"ENOENT"},
        "openat2_no_xdev": {"EXDEV", "ENOENT"},       # refuses to cross into the empty mount
        "openat2_in_root": {"ENOENT"}, "openat2_proc_root": {"ENOENT", "EXDEV", "ELOOP"},
        # no capability after the drop, root included; seccomp refuses a new user namespace
        "umount": {"EPERM"}, "remount_rw": {"EPERM"}, "mount_tmpfs": {"EPERM"}, "bind_out": {"EPERM"},
        "unshare_mount": {"EPERM"}, "read_after": {"ENOENT"}}
    wrong = {name: inside[name] for name, ok in accepted.items() if inside[name]["result"] not in ok}
    assert not wrong, wrong
    assert secret not in json.dumps(inside)

    # Control: the same user outside vpnw reaches the key each of these ways
    # (the mounts left out: root's would change the world's own mounts).
    mounts = {"umount", "remount_rw", "mount_tmpfs", "bind_out"}
    outside = probe_key(runs, [op for op in key_reach_ops(keys(runs.state), work_out)
                               if op["name"] not in mounts], inside=False, cwd=work_out)
    for name in ("symlink_read", "dotdot", "proc_cwd", "openat2_beneath", "openat2_no_xdev",
                 "openat2_in_root", "openat2_proc_root", "read_after"):
        assert outside[name]["result"] == "ok" and secret in outside[name]["data"], outside[name]
    assert outside["hardlink"]["result"] == "ok", outside["hardlink"]
    # ...and, outside, a new user namespace gives it the mount rights the sandbox refuses.
    assert outside["unshare_mount"] == {"op": "unshare_mount", "result": "ok", "data": []}, outside
    assert runs.verify().returncode == 0

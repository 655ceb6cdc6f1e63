"""The signatures themselves (stages/record/sodium.py, stages/record/signing.py):
libsodium through ctypes gives RFC 8032's Ed25519, the same keys and
signatures as the `cryptography` package the signed end used before (so
keys and runs made by that code still verify), minisign reads what vpnw
writes and vpnw reads what minisign writes, and a machine without
libsodium cannot start a signed run (fail closed, the fix named).

The end-to-end side (runs as root and vpnwtest, the library hidden from a
real run) is tests/test_e2e_signed_end.py."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ci_support import cannot
from stages.record import evidence, ledger, signing, sodium
from stages.recorder.seal import Sealer

# RFC 8032, section 7.1, TEST 1 and TEST 2.
RFC8032 = [
    ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46b"
     "d25bf5f0595bbe24655141438e7a100b"),
    ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c"
     "387b2eaeb4302aeeb00d291612bb0c00"),
]


@pytest.mark.parametrize("seed, public, message, signature", RFC8032)
def test_libsodium_gives_rfc8032s_keys_and_signatures(seed, public, message, signature):
    seed, message = bytes.fromhex(seed), bytes.fromhex(message)
    assert sodium.public_key(seed).hex() == public
    assert sodium.sign(seed, message).hex() == signature
    assert sodium.verify(bytes.fromhex(public), bytes.fromhex(signature), message)
    flipped = bytearray(bytes.fromhex(signature))
    flipped[0] ^= 1
    assert not sodium.verify(bytes.fromhex(public), bytes(flipped), message)
    assert not sodium.verify(bytes.fromhex(public), bytes.fromhex(signature), message + b"x")
    assert not sodium.verify(bytes.fromhex(public)[:31], bytes.fromhex(signature), message)


def test_the_same_keys_and_signatures_as_the_cryptography_package():
    """What the code before libsodium made (cryptography's Ed25519 on the same
    seed) is what libsodium makes: old keys give the same public key, old
    signatures check, new ones are byte for byte what the old code wrote."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        cannot("the cryptography package is missing (pyproject's test extra installs it)")
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    for n in range(20):
        seed, message = os.urandom(32), os.urandom(n * 7)
        theirs = ed25519.Ed25519PrivateKey.from_private_bytes(seed)
        public = theirs.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        assert sodium.public_key(seed) == public
        assert sodium.sign(seed, message) == theirs.sign(message)
        assert sodium.verify(public, theirs.sign(message), message)


def test_a_key_file_and_signature_round_trip_with_minisign(tmp_path):
    """vpnw's key file, public key and .minisig against Debian's minisign, both ways."""
    if shutil.which("minisign") is None:
        cannot("minisign is not installed (scripts/setup installs it)")
    key = signing.load_secret(str(tmp_path / "keys"))
    data = tmp_path / "run.jsonl"
    data.write_bytes(b'{"a":1}\n' * 100)
    fd = os.open(data, os.O_RDONLY)
    digest, lines = signing.file_digest(fd)
    os.close(fd)
    assert lines == 100
    (tmp_path / "run.jsonl.minisig").write_text(key.sign_file_digest(digest, "vpnw run=r-1", "vpnw"))
    pub = tmp_path / "vpnw.pub"
    pub.write_text(key.public().minisign_text())
    m = subprocess.run(["minisign", "-V", "-p", str(pub), "-m", str(data)], capture_output=True, text=True)
    assert m.returncode == 0 and "Trusted comment: vpnw run=r-1" in m.stdout, m

    # minisign's own key and signature, checked by vpnw.
    g = subprocess.run(["minisign", "-G", "-W", "-p", str(tmp_path / "m.pub"), "-s", str(tmp_path / "m.key")],
                       capture_output=True, text=True)
    assert g.returncode == 0, g
    s = subprocess.run(["minisign", "-S", "-s", str(tmp_path / "m.key"), "-m", str(data), "-t", "theirs"],
                       capture_output=True, text=True)
    assert s.returncode == 0, s
    theirs = signing.parse_minisig((tmp_path / "run.jsonl.minisig").read_text())
    public = signing.load_public(str(tmp_path / "m.pub"))
    assert signing.check_signature(theirs, public, digest) is None
    assert signing.check_signature(theirs, public, bytes(64)) == (
        "the signature does not match the file: it was changed after it was signed")


@pytest.fixture
def no_libsodium(monkeypatch):
    """This process as on a machine without libsodium: its soname is one no
    library has, and nothing is loaded yet."""
    monkeypatch.setattr(sodium, "SONAME", "libsodium-not-here.so.23")
    monkeypatch.setattr(sodium, "_library", None)


def test_without_libsodium_a_signed_run_cannot_start_and_says_the_fix(tmp_path, monkeypatch, no_libsodium):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    with pytest.raises(signing.SigningUnavailable) as caught:
        Sealer.open()
    assert str(caught.value).startswith("libsodium, which signs vpnw's runs, cannot be loaded (")
    assert str(caught.value).endswith("fix: install it (Debian: apt-get install libsodium23; "
                                      "scripts/setup does)")
    assert isinstance(caught.value, OSError)        # the recorder's open says it and stops (125)
    assert not os.path.exists(tmp_path / "vpnw" / "keys")      # nothing made before it


def test_without_libsodium_verify_says_the_signature_was_not_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    from test_record_ledger import a_run_file
    path = str(tmp_path / "r-000001.jsonl")
    start, end = a_run_file(path, "r-000001")
    fd = os.open(path, os.O_WRONLY)
    Sealer.open().seal(fd, path, start, end, end["d"])
    os.close(fd)
    key = evidence.public_key_for(None)
    assert evidence.check(path, key=key, ledger=ledger.read()).exit_code == 0

    monkeypatch.setattr(sodium, "SONAME", "libsodium-not-here.so.23")
    monkeypatch.setattr(sodium, "_library", None)
    found = evidence.check(path, key=key, ledger=ledger.read())
    assert found.exit_code == 2          # unproven, never "whole"
    signature, entry = found.layers[1], found.layers[2]
    assert (signature.status, entry.status) == ("absent", "absent")
    assert signature.message.startswith(f"{path}.minisig: signed by key ")
    assert "; libsodium, which signs vpnw's runs, cannot be loaded (" in signature.message
    assert "names this run, but its signature cannot be checked: libsodium" in entry.message


def test_doctor_says_whether_runs_can_be_signed(monkeypatch):
    from stages.orchestrator.doctor import check_signing
    assert check_signing().status == "ok"
    monkeypatch.setattr(sodium, "SONAME", "libsodium-not-here.so.23")
    monkeypatch.setattr(sodium, "_library", None)
    check = check_signing()
    assert (check.name, check.status, check.fix) == ("signing", "fail", "apt-get install libsodium23")
    assert check.detail.startswith("libsodium, which signs vpnw's runs, cannot be loaded (")


def test_the_public_half_is_written_when_the_run_starts(tmp_path, monkeypatch):
    """Sealer.open, before the program, writes run-signing.pub beside a new
    key and puts back one that was removed, so the signing at the run's end
    does less (it was a third of that step's CPU). Failed before: only the
    seal at the end wrote it."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    sealer = Sealer.open()
    pub = os.path.join(os.path.dirname(sealer.key.path), signing.PUBLIC_NAME)
    assert open(pub).read() == sealer.key.public().minisign_text()
    os.unlink(pub)
    again = Sealer.open()
    assert open(pub).read() == again.key.public().minisign_text() == sealer.key.public().minisign_text()


def test_a_signature_left_under_the_name_is_replaced_never_written_through(tmp_path, monkeypatch):
    """A .minisig already at the name (an earlier run under the same
    --record, or a link planted there) is removed and a new file made: the
    file it was linked to keeps its content. Failed before: it was truncated
    in place and the signature written through the link (and on ext4 a file
    truncated to nothing is written back when closed, 0.5-4 ms on the way to
    vpnw's exit, where a new file costs ~0.1 ms)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    from test_record_ledger import a_run_file
    path = str(tmp_path / "r-000001.jsonl")
    start, end = a_run_file(path, "r-000001")
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's own\n")
    os.link(notes, f"{path}.minisig")
    fd = os.open(path, os.O_WRONLY)
    sig, _seq, _head = Sealer.open().seal(fd, path, start, end, end["d"])
    os.close(fd)
    assert notes.read_text() == "the user's own\n" and notes.stat().st_nlink == 1
    assert open(f"{path}.minisig").read() == sig
    assert os.stat(f"{path}.minisig").st_mode & 0o777 == 0o600
    assert evidence.check(path, key=evidence.public_key_for(None), ledger=ledger.read()).exit_code == 0

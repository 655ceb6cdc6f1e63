"""The signed end of a run (docs/record.md, "The signed end"): an Ed25519 key
of vpnw's own and minisign's file formats, so a stock tool checks what vpnw
signs (`minisign -V -p run-signing.pub -m r-36e0ba.jsonl`).

The key lives in vpnw's state directory, `keys/` (0700), hidden from the
program by an empty mount (stages/helper/out_of_reach.py):

    run-signing.key   the secret: 32 random bytes (the Ed25519 seed) and a
                      key id, 0600; read by the recorder when a run starts
    run-signing.pub   its public half in minisign's format (`vpnw key`)

A signature is minisign's (`.minisig`): the file's BLAKE2b-512, signed
("ED", minisign's default since 0.11), and a trusted comment, signed with
that signature, which names the run, its end and its last digest.

Reading and writing the key files and the minisign texts needs no crypto
library. Signing and checking use libsodium (stages/record/sodium.py),
minisign's own library, loaded when a run opens its key (under a
millisecond) so that a machine without it stops the run before the program
(exit 125), not at its end.
"""
from __future__ import annotations

import binascii     # base64's two calls without its module (~0.4 ms on the way to run.start)
import errno
import os
import stat

# NamedTuple, not dataclasses: the recorder imports this module before the
# program starts, and a dataclass costs some 0.8 ms of CPU to make, a NamedTuple 0.15.
from stages.startup.records import NamedTuple  # typing's, without importing typing
from stages.record import sodium
from stages.record.digests import blake2b
from stages.record.events import vpnw_state_dir

SECRET_NAME = "run-signing.key"
PUBLIC_NAME = "run-signing.pub"
_SECRET_COMMENT = ("untrusted comment: vpnw run-signing secret key (Ed25519 seed); never share it, "
                   "`vpnw key` prints its public half")
_ALG_KEY = b"Ed"          # minisign: the key's algorithm
_ALG_HASHED = b"ED"       # minisign: a signature over the file's BLAKE2b-512
_ALG_LEGACY = b"Ed"       # minisign: a signature over the file itself (accepted when read)
MAX_COMMENT = 1024


class KeyProblem(Exception):
    """A key file that is missing, unreadable or not a key; the message names
    the file and the fix."""


SigningUnavailable = sodium.SodiumMissing     # no libsodium: nothing can be signed or checked


def signing_library() -> None:
    """Load what signs and checks now (raises SigningUnavailable, naming the fix)."""
    sodium.library()


def _b64(data: bytes) -> str:
    """base64.b64encode(data).decode()"""
    return binascii.b2a_base64(data, newline=False).decode()


def _unb64(text: str) -> bytes:
    """base64.b64decode(text, validate=True): ValueError (binascii.Error)
    for anything but whole base64."""
    return binascii.a2b_base64(text, strict_mode=True)


def key_dir() -> str:
    return os.path.join(vpnw_state_dir(), "keys")


def key_id_text(key_id: bytes) -> str:
    """A key id as minisign prints it (a little-endian 64-bit number in hex)."""
    return format(int.from_bytes(key_id, "little"), "016X")


class PublicKey(NamedTuple):
    """An Ed25519 public key and its minisign key id."""
    key_id: bytes      # 8 bytes
    raw: bytes         # 32 bytes

    @property
    def id_text(self) -> str:
        return key_id_text(self.key_id)

    def minisign_text(self) -> str:
        return (f"untrusted comment: minisign public key {self.id_text}\n"
                + _b64(_ALG_KEY + self.key_id + self.raw) + "\n")


class SecretKey(NamedTuple):
    """vpnw's signing key: its minisign key id and the Ed25519 seed."""
    key_id: bytes      # 8 bytes
    seed: bytes        # 32 bytes
    path: str = ""

    @property
    def id_text(self) -> str:
        return key_id_text(self.key_id)

    def public(self) -> PublicKey:
        return PublicKey(self.key_id, sodium.public_key(self.seed))

    def sign_file_digest(self, digest: bytes, trusted_comment: str, untrusted_comment: str) -> str:
        """A .minisig text for a file whose BLAKE2b-512 is `digest`."""
        if "\n" in trusted_comment or len(trusted_comment.encode()) > MAX_COMMENT:
            raise ValueError("a trusted comment is one line of at most 1024 bytes")
        signature = sodium.sign(self.seed, digest)
        global_signature = sodium.sign(self.seed, signature + trusted_comment.encode())
        return (f"untrusted comment: {untrusted_comment}\n"
                + _b64(_ALG_HASHED + self.key_id + signature) + "\n"
                + f"trusted comment: {trusted_comment}\n"
                + _b64(global_signature) + "\n")


def file_digest(fd: int) -> tuple[bytes, int]:
    """(BLAKE2b-512, number of lines) of a file read from its start: what a
    "ED" signature signs, and the count its trusted comment gives."""
    h = blake2b()
    lines = offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        lines += chunk.count(b"\n")
        offset += len(chunk)
    return h.digest(), lines


# ---------------------------------------------------------------- key files

def _second_line(text: str, what: str, path: str) -> bytes:
    lines = text.splitlines()
    if len(lines) < 2 or not lines[0].startswith("untrusted comment:"):
        raise KeyProblem(f"{path} is not {what}: expected an 'untrusted comment:' line and a "
                         "base64 line")
    try:
        return _unb64(lines[1].strip())
    except ValueError:
        raise KeyProblem(f"{path} is not {what}: its second line is not base64") from None


def parse_secret(text: str, path: str) -> SecretKey:
    blob = _second_line(text, "a vpnw signing key", path)
    if len(blob) != 42 or blob[:2] != _ALG_KEY:
        raise KeyProblem(f"{path} is not a vpnw signing key: wrong length or algorithm")
    return SecretKey(blob[2:10], blob[10:], path)


def parse_public(text: str, path: str) -> PublicKey:
    blob = _second_line(text, "a minisign public key", path)
    if len(blob) != 42 or blob[:2] != _ALG_KEY:
        raise KeyProblem(f"{path} is not a minisign Ed25519 public key: wrong length or algorithm")
    return PublicKey(blob[2:10], blob[10:])


def read_small_file(path: str, limit: int) -> bytes:
    """Up to `limit` bytes of a regular file, without waiting: a FIFO put where
    a key or a signature should be would hold its reader (a run about to
    start, `show --verify`) forever, so anything but a regular file is
    refused (OSError, its strerror saying what it is)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _read_text(path: str, what: str, fix: str) -> str:
    try:
        data = read_small_file(path, 4096)
    except OSError as exc:
        raise KeyProblem(f"cannot read {what} {path}: {exc.strerror or exc}; fix: {fix}") from None
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise KeyProblem(f"{path} is not {what}: not ASCII text; fix: {fix}") from None


_SECRET_FIX = ("make it readable by you, or move it away and vpnw makes a new key "
               "(runs signed by the old one then verify only with its public key: "
               "`vpnw show --verify --key FILE`)")


def load_secret(directory: str | None = None, *, create: bool = True) -> SecretKey:
    """The signing key, made on first use (0600, in a 0700 directory). Raises
    KeyProblem when it exists and cannot be read or is not a key, or cannot
    be made. Needs no crypto library: the public half is derived later."""
    directory = directory or key_dir()
    path = os.path.join(directory, SECRET_NAME)
    if create and not os.path.lexists(path):
        return _create_secret(directory, path)
    text = _read_text(path, "the vpnw signing key", _SECRET_FIX)
    try:
        return parse_secret(text, path)
    except KeyProblem as exc:
        raise KeyProblem(f"{exc}; fix: {_SECRET_FIX}") from None


def _create_secret(directory: str, path: str) -> SecretKey:
    key = SecretKey(os.urandom(8), os.urandom(32), path)
    text = f"{_SECRET_COMMENT}\n{_b64(_ALG_KEY + key.key_id + key.seed)}\n"
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        temp = os.path.join(directory, f".{SECRET_NAME}.{os.getpid()}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            # link, not rename: two runs that start together keep one key.
            os.link(temp, path)
        except FileExistsError:
            return load_secret(directory, create=False)
        finally:
            os.unlink(temp)
    except OSError as exc:
        raise KeyProblem(f"cannot make the vpnw signing key {path}: {exc.strerror or exc}; fix: "
                         f"make {directory} writable, or point XDG_STATE_HOME at a writable "
                         "directory") from None
    return key


def public_key_file(secret: SecretKey, directory: str | None = None) -> str:
    """Where the public half is written (derived once from the secret)."""
    directory = directory or os.path.dirname(secret.path) or key_dir()
    path = os.path.join(directory, PUBLIC_NAME)
    text = secret.public().minisign_text()
    try:
        # Bytes, not a text stream: its codec is one more import on the
        # recorder's way to run.start; and a FIFO there does not hold the run.
        if read_small_file(path, len(text) + 1) == text.encode():
            return path
    except OSError:
        pass
    temp = f"{path}.{os.getpid()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        if os.write(fd, text.encode()) != len(text):
            raise OSError(errno.ENOSPC, "written in part")
    finally:
        os.close(fd)
    os.chmod(temp, 0o644)
    os.replace(temp, path)
    return path


def retire_key(directory: str | None = None) -> str | None:
    """Before a new key: the old secret is removed and its public half kept
    as run-signing-<ID>.pub (its path returned; None: there was no key)."""
    directory = directory or key_dir()
    try:
        old = load_secret(directory, create=False)
    except KeyProblem:
        if os.path.lexists(os.path.join(directory, SECRET_NAME)):
            raise
        return None
    kept = os.path.join(directory, f"run-signing-{old.id_text}.pub")
    with open(kept, "w", encoding="ascii") as stream:
        stream.write(old.public().minisign_text())
    os.unlink(old.path)
    try:
        os.unlink(os.path.join(directory, PUBLIC_NAME))
    except FileNotFoundError:
        pass
    return kept


def load_public(path: str) -> PublicKey:
    return parse_public(_read_text(path, "a minisign public key", "give the .pub file "
                                   "`vpnw key` printed"), path)


# ---------------------------------------------------------------- signatures

class Minisig(NamedTuple):
    """A .minisig read: the signature, the trusted comment and its signature."""
    algorithm: bytes
    key_id: bytes
    signature: bytes
    trusted_comment: str
    global_signature: bytes

    @property
    def id_text(self) -> str:
        return key_id_text(self.key_id)

    def fields(self) -> dict[str, str]:
        """vpnw's trusted comment, `vpnw key=value ...`, as a dict (empty
        when the comment is not vpnw's)."""
        words = self.trusted_comment.split()
        if not words or words[0] != "vpnw":
            return {}
        return dict(w.split("=", 1) for w in words[1:] if "=" in w)


class BadSignature(ValueError):
    pass


def parse_minisig(text: str) -> Minisig:
    lines = text.splitlines()
    if len(lines) < 4 or not lines[0].startswith("untrusted comment:") \
            or not lines[2].startswith("trusted comment: "):
        raise BadSignature("not a minisign signature (four lines: untrusted comment, signature, "
                           "trusted comment, its signature)")
    try:
        blob = _unb64(lines[1].strip())
        global_signature = _unb64(lines[3].strip())
    except ValueError:
        raise BadSignature("not a minisign signature: a signature line is not base64") from None
    if len(blob) != 74 or blob[:2] not in (_ALG_HASHED, _ALG_LEGACY) or len(global_signature) != 64:
        raise BadSignature("not a minisign Ed25519 signature: wrong length or algorithm")
    return Minisig(blob[:2], blob[2:10], blob[10:], lines[2][len("trusted comment: "):],
                   global_signature)


def check_signature(sig: Minisig, key: PublicKey, digest: bytes, read_whole=None) -> str | None:
    """None when `sig` is `key`'s signature of the file (BLAKE2b-512 `digest`;
    a legacy signature needs `read_whole()`, the file's bytes) and of its
    trusted comment; else what does not hold. Raises SigningUnavailable."""
    if sig.key_id != key.key_id:
        return f"signed by key {sig.id_text}, not by {key.id_text}"
    message = digest if sig.algorithm == _ALG_HASHED else (read_whole() if read_whole else b"")
    if not sodium.verify(key.raw, sig.signature, message):
        return "the signature does not match the file: it was changed after it was signed"
    return check_comment(sig, key)


def check_comment(sig: Minisig, key: PublicKey) -> str | None:
    """None when the trusted comment carries `key`'s signature. Raises
    SigningUnavailable."""
    if not sodium.verify(key.raw, sig.global_signature, sig.signature + sig.trusted_comment.encode()):
        return "the trusted comment was changed after it was signed"
    return None


def trusted_comment(run_id: str, end: dict | None, lines: int, digest: str,
                    ledger_seq: int | None, ledger_prev: str | None) -> str:
    """What a run's signature says of it, one line that `minisign -V` prints:
    `vpnw run=r-36e0ba end=run.end lines=57 exit=0 connections=12 denied=1
    would_deny=0 failed=1 digest=<the last d> ledger=12 prev=<the ledger's head before>`.
    `end` is run.end's fields (None: the record has no run.end, `end=cut`)."""
    words = [f"run={run_id}", f"end={'run.end' if end is not None else 'cut'}", f"lines={lines}"]
    if end is not None:
        for name in ("exit_code", "connections", "denied", "would_deny", "failed"):
            value = end.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                words.append(f"{'exit' if name == 'exit_code' else name}={value}")
    words += [f"digest={digest or '-'}", f"ledger={ledger_seq if ledger_seq else '-'}",
              f"prev={ledger_prev or '-'}"]
    return "vpnw " + " ".join(w for w in words if w.isprintable() and not any(c.isspace() for c in w))

"""The recorder's end of a run (docs/record.md, "The signed end", "The
ledger"): the run file signed with vpnw's key, entered in the ledger of
runs, and its .minisig written beside it.

Opened when the run starts, so a key or a ledger that cannot be used stops
the run before the program exists (fail closed: a run that cannot be
recorded whole is not run). The signing itself happens once, after the
last line: nothing here runs per event.
"""
from __future__ import annotations

import errno
import os
import stat

import orjson

from stages.record import ledger, signing


class Sealer:
    """The key and the ledger, held from the run's start to its end."""

    def __init__(self, key: signing.SecretKey, ledger_file: str):
        self.key = key
        self.ledger_file = ledger_file

    @classmethod
    def open(cls) -> "Sealer":
        """Raises signing.KeyProblem or OSError (signing.SigningUnavailable:
        no libsodium; the message says the fix)."""
        # The library first: a machine that cannot sign stops here, before
        # the program, not after it (and loading it costs well under 1 ms).
        signing.signing_library()
        key = signing.load_secret()
        path = ledger.ledger_path()
        try:
            # Made now (0600) so that a ledger that cannot be written is known
            # before the program runs.
            # O_NONBLOCK: a FIFO in its place fails here, it does not hold the run.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file")
            finally:
                os.close(fd)
        except OSError as exc:
            raise OSError(f"cannot write the ledger of runs {path}: {exc.strerror or exc}; fix: "
                          "make vpnw's state directory writable, or point XDG_STATE_HOME at a "
                          "writable directory") from None
        # The public half beside the key, kept in step with it (a key made
        # anew by this run, or one whose .pub was removed): now, not at the
        # end, where it was a third of the signing's CPU on the way out.
        try:
            signing.public_key_file(key)
        except OSError as exc:
            raise OSError(f"cannot write the public key beside vpnw's signing key {key.path}: "
                          f"{exc.strerror or exc}; fix: make that directory writable") from None
        return cls(key, path)

    def seal(self, fd: int, record: str, start: dict | None, end: dict | None,
             last_digest: str) -> tuple[str, int, str]:
        """Sign the run file open on `fd`, enter it in the ledger, write
        `record`.minisig. Returns the signature (a .minisig text), the
        ledger entry's seq and the ledger's new head (its `d`)."""
        # The recorder's descriptor writes only; the same file, opened again
        # through it (not by name: the name may point elsewhere by now).
        reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            digest, lines = signing.file_digest(reader)
        finally:
            os.close(reader)
        run_id = (start or end or {}).get("run") or "-"
        end_fields = end["fields"] if end and end.get("type") == "run.end" else None
        path = os.path.realpath(record)
        with ledger.locked(self.ledger_file) as book:
            comment = signing.trusted_comment(run_id, end_fields, lines, last_digest, book.seq,
                                              book.head)
            sig = self.key.sign_file_digest(
                digest, comment, f"vpnw run {run_id}, signed by key {self.key.id_text}; "
                                 f"check with `vpnw show --verify` or minisign -V")
            entry = book.append({"run": run_id, "file": path, "start": (start or {}).get("ts"),
                         "end": end["ts"] if end_fields is not None else None, "lines": lines,
                         "digest": last_digest, "key": self.key.id_text, "sig": sig})
        _write_beside(path + ".minisig", sig)
        return sig, book.seq, orjson.loads(entry)["d"]


def _write_beside(path: str, text: str) -> None:
    """A new file at `path`: one an earlier run left under the same name is
    removed first, never truncated in place. On ext4 a file truncated to
    nothing is written back when it is closed (auto_da_alloc): 0.5-4 ms on
    the way to vpnw's exit, where a new file costs ~0.1 ms; and a link
    planted at the name is never written through. A name that cannot be
    removed (its directory is read-only to us) is written over as before."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        os.unlink(path)
        flags |= os.O_EXCL
    except FileNotFoundError:
        flags |= os.O_EXCL
    except OSError:
        flags |= os.O_TRUNC
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)

"""What a run file proves, layer by layer (docs/record.md, "Checking a run";
docs/security.md says against whom): its digest chain, its signature, and
its entry in the ledger of runs. `vpnw show --verify` prints every layer;
`show`, `show --summary` and `learn` warn in one line when one fails.

A layer is "ok", "failed" (the file or the ledger was changed, cut,
replaced or removed: exit 1), "running" (the run is still going: its chain
is whole so far, and it is signed and entered in the ledger when it ends:
exit 124) or "absent" (nothing to check it against: an older vpnw, a record
written to stdout, a key this machine does not hold: exit 2). Only a run
whose every layer is ok verifies (exit 0).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from stages.record import chain, ledger as ledger_mod, signing
from stages.record.events import state_dir
from stages.record.runs import start_event, still_running
from stages.wire.exits import ExitCode


@dataclass(frozen=True)
class EvidenceLayer:
    name: str          # "chain", "signature", "ledger"
    status: str        # "ok", "failed", "running", "absent"
    message: str


@dataclass
class Evidence:
    path: str
    layers: list[EvidenceLayer] = field(default_factory=list)
    chain_verdict: chain.Verdict | None = None

    @property
    def exit_code(self) -> int:
        statuses = [layer.status for layer in self.layers]
        if "failed" in statuses:
            return 1
        if "running" in statuses:
            return ExitCode.STILL_RUNNING
        return 2 if "absent" in statuses else 0

    @property
    def running(self) -> bool:
        return any(layer.status == "running" for layer in self.layers)

    def failures(self) -> list[EvidenceLayer]:
        return [layer for layer in self.layers if layer.status == "failed"]

    def warning(self) -> str | None:
        """One line for `show` and `learn` when the file does not verify."""
        # Runs gone from beside it say nothing of this file.
        failed = [layer for layer in self.failures() if layer.name != "runs"]
        if not failed:
            return None
        names = ", ".join(layer.name for layer in failed)
        return (f"warning: {self.path} does not verify ({names} failed): what it says may not be "
                f"what happened; `vpnw show --verify {self.path}` says where")


def public_key_for(key_file: str | None, key_directory: str | None = None) -> signing.PublicKey | None:
    """The key to check against: --key FILE, else this machine's (its .pub,
    or derived from the secret when the .pub is gone). None: no key here.
    Raises signing.KeyProblem for a --key FILE that is not a public key."""
    if key_file:
        return signing.load_public(key_file)
    directory = key_directory or signing.key_dir()
    public = os.path.join(directory, signing.PUBLIC_NAME)
    if os.path.exists(public):
        return signing.load_public(public)
    try:
        return signing.load_secret(directory, create=False).public()
    except (signing.KeyProblem, signing.SigningUnavailable):
        return None


def check(path: str, *, key: signing.PublicKey | None, ledger: ledger_mod.Ledger | None) -> Evidence:
    """Every layer of the run file at `path`."""
    evidence = Evidence(path)
    with open(path, "rb") as stream:
        verdict = chain.verify(stream)
    evidence.chain_verdict = verdict
    if verdict.status == "broken" and verdict.open_end and _still_running(path):
        return _running(evidence, verdict, ledger)
    evidence.layers.append(EvidenceLayer("chain", {"whole": "ok", "broken": "failed"}.get(verdict.status, "absent"),
                                 verdict.message))
    run_id = _run_id(path)
    entry = None
    if ledger is not None:
        entry = ledger.by_file(path) or (ledger.by_run(run_id) if run_id else None)
    sig_text, where = _signature_text(path, entry)
    sig = None
    if sig_text is None:
        evidence.layers.append(EvidenceLayer("signature", "absent", "none: no .minisig beside the file and no "
                                     "entry in the ledger (a record written to stdout, or by a "
                                     "vpnw before signatures)"))
    else:
        sig, layer = _check_signature(path, sig_text, where, key)
        evidence.layers.append(layer)
    if ledger is not None:
        evidence.layers.append(_check_ledger(path, run_id, verdict, entry, sig, key, ledger))
        # Runs gone are looked for in vpnw's runs folder only (what `vpnw runs`
        # lists): a --record file elsewhere sits in the user's own directory,
        # where a file moved or deleted says nothing of the files beside it.
        folder = os.path.dirname(os.path.realpath(path))
        gone = ledger.gone_from(folder) if folder == os.path.realpath(state_dir()) else []
        if gone:
            names = ", ".join(f"{e.get('run')} (entry {e.get('seq')})" for e in gone[:10])
            evidence.layers.append(EvidenceLayer("runs", "failed", f"in {ledger.path}, gone from "
                                         f"{os.path.dirname(os.path.realpath(path))}: {names}: "
                                         "deleted or moved away"))
    return evidence


def _still_running(path: str) -> bool:
    return still_running(path)


def _running(evidence: Evidence, verdict: chain.Verdict, ledger) -> Evidence:
    """A run still going: what is there so far is checked (a break before its
    end is still a failure, found by the caller); it is signed and entered
    in the ledger only when it ends."""
    whole = verdict.lines if verdict.message.startswith("the file ends after") else verdict.lines - 1
    last = f"; last digest {verdict.digest}" if verdict.digest else ""
    evidence.layers.append(EvidenceLayer("chain", "running", f"still running: the chain is whole so far, "
                                 f"{whole} lines from run.start{last} (run.end closes it when the "
                                 f"run ends)"))
    evidence.layers.append(EvidenceLayer("signature", "running", "not yet: vpnw signs the run when it ends"))
    where = ledger.path if ledger is not None else "the ledger of runs"
    evidence.layers.append(EvidenceLayer("ledger", "running", f"not yet: the run is entered in {where} "
                                 "when it ends"))
    return evidence


def warning_for(path: str) -> str | None:
    """The one line `show` and `learn` print before reading a run file that
    does not verify with this machine's key and ledger; None when it does
    (or has nothing to check it against)."""
    try:
        return check(path, key=public_key_for(None), ledger=ledger_mod.read()).warning()
    except Exception as exc:    # noqa: BLE001 - a check that cannot run is said, never fatal
        return f"warning: {path} could not be verified ({exc})"


def _run_id(path: str) -> str | None:
    start = start_event(path)
    return start.get("run") if start else None


def _signature_text(path: str, entry: dict | None) -> tuple[str | None, str]:
    try:
        return signing.read_small_file(path + ".minisig", 8192).decode(), f"{path}.minisig"
    except (OSError, UnicodeDecodeError):
        pass      # none, or not one to read: the ledger's copy, if any
    if entry is not None and isinstance(entry.get("sig"), str):
        return entry["sig"], f"the ledger's entry {entry.get('seq')}"
    return None, ""


def _check_signature(path: str, text: str, where: str, key: signing.PublicKey | None):
    try:
        sig = signing.parse_minisig(text)
    except signing.BadSignature as exc:
        return None, EvidenceLayer("signature", "failed", f"{where}: {exc}")
    if key is None:
        return sig, EvidenceLayer("signature", "absent", f"signed by key {sig.id_text}, and no public key "
                          "to check it with: this machine has no vpnw key; give the signer's "
                          "with --key FILE")
    if sig.key_id != key.key_id:
        return sig, EvidenceLayer("signature", "absent", f"signed by key {sig.id_text}, not by "
                          f"{key.id_text}: give key {sig.id_text}'s public key with --key FILE "
                          "(a key rotated away, or another machine's)")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        digest, _lines = signing.file_digest(fd)
    finally:
        os.close(fd)
    try:
        problem = signing.check_signature(sig, key, digest)
    except signing.SigningUnavailable as exc:
        return sig, EvidenceLayer("signature", "absent", f"{where}: signed by key {sig.id_text}; {exc}")
    if problem:
        return sig, EvidenceLayer("signature", "failed", f"{where}: {problem}")
    return sig, EvidenceLayer("signature", "ok", f"good: signed by key {key.id_text} ({where}); "
                      f"trusted comment: {sig.trusted_comment}")


def _check_ledger(path, run_id, verdict, entry, sig, key, ledger) -> EvidenceLayer:
    if ledger.unreadable:
        return EvidenceLayer("ledger", "absent", ledger.unreadable_text())
    if ledger.problem:
        return EvidenceLayer("ledger", "failed", ledger.problem)

    signed = sig.fields() if sig is not None else {}
    ours = key is not None and sig is not None and sig.key_id == key.key_id
    if entry is None:
        seq = signed.get("ledger", "-")
        if ours and seq != "-":
            state = "is missing" if ledger.exists else "is missing: the ledger itself is gone"
            return EvidenceLayer("ledger", "failed", f"the run was entered as entry {seq} of {ledger.path}, "
                         f"which {state} (the ledger was cut or replaced)")
        return EvidenceLayer("ledger", "absent", f"no entry for this run in {ledger.path}")
    if entry.get("run") != run_id or entry.get("digest") != verdict.digest:
        return EvidenceLayer("ledger", "failed", f"entry {entry.get('seq')} of {ledger.path} says "
                     f"{entry.get('file')} held run {entry.get('run')} ending in digest "
                     f"{entry.get('digest')}; this file holds run {run_id} ending in "
                     f"{verdict.digest}: it was replaced or rewritten")
    if key is not None and isinstance(entry.get("sig"), str):
        try:
            problem = _entry_signature_problem(entry, key)
        except signing.SigningUnavailable as exc:
            return EvidenceLayer("ledger", "absent", f"entry {entry.get('seq')} of {ledger.path} names "
                         f"this run, but its signature cannot be checked: {exc}")
        if problem:
            return EvidenceLayer("ledger", "failed", f"entry {entry.get('seq')}: {problem}")
    at = "" if entry.get("file") == os.path.realpath(path) else f", recorded as {entry.get('file')}"
    return EvidenceLayer("ledger", "ok", f"entry {entry.get('seq')} of {len(ledger.entries)} in "
                 f"{ledger.path} agrees{at}; the ledger's chain is whole")


def _entry_signature_problem(entry: dict, key: signing.PublicKey) -> str | None:
    """The entry's own claims (its seq and the head before it, checked by
    ledger.read) are signed: its trusted comment must carry this key's
    signature."""
    try:
        sig = signing.parse_minisig(entry["sig"])
    except signing.BadSignature as exc:
        return str(exc)
    if sig.key_id != key.key_id:
        return None     # signed before a key rotation: its place is checked by the chain
    return signing.check_comment(sig, key)

"""Writing a person's answer back into the policy file (`guard --ask`).

The file is the person's: its comments, order and layout stay as they are
(tomlkit edits the document in place rather than rewriting it). The rule
goes to the end of the `allow` (or `deny`) array of [policy], on a line of
its own with a comment that says when and in which run it was added.

The write is atomic: the new text goes to a temporary file in the same
directory, is flushed to the disk (fsync), takes the old file's mode and
owner, and is renamed over the old one; a crash leaves the old file or the
new one, never half of one. And it refuses when the file is no longer what
the run read (its SHA-256 differs): a person or another run edited it
meanwhile, and their edit is never silently overwritten.

tomlkit is imported here only, and only when an answer is written.
"""
from __future__ import annotations

import hashlib
import os
import tempfile


class EditRefused(Exception):
    """The rule was not written; str() says why, for a person."""


def text_sha256(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def with_rule(text: str, which: str, rule: str, comment: str) -> str:
    """The policy text with `rule` added to [policy]'s `which` list (pure).
    The text is returned unchanged when the list already holds the rule."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError
    if which not in ("allow", "deny"):
        raise ValueError(which)
    try:
        document = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise EditRefused(f"the file no longer reads as TOML ({exc})") from None
    body = document.get("policy")
    if body is None or not hasattr(body, "get"):
        raise EditRefused("the file has no [policy] table")
    rules = body.get(which)
    if rules is None:
        rules = tomlkit.array()
        rules.multiline(True)
        body[which] = rules
    elif not isinstance(rules, list):
        raise EditRefused(f"[policy] {which} is not an array")
    if rule in [str(item) for item in rules]:
        return text
    if hasattr(rules, "add_line"):
        rules.add_line(rule, comment=comment)
        if not _ends_with_newline_item(rules):
            rules.add_line(indent="")
    else:     # older tomlkit: the rule without its comment
        rules.append(rule)
    return tomlkit.dumps(document)


def _ends_with_newline_item(rules) -> bool:
    return rules.as_string().rstrip(" ").endswith("\n]")


def add_rule(path: str, which: str, rule: str, *, expected_sha256: str, run_id: str,
             today: str) -> str:
    """Add `rule` to the policy file at `path` if the file is still the one
    the run read (its SHA-256 is `expected_sha256`). Returns the new text's
    SHA-256 (the next answer of the same run compares against it)."""
    real = os.path.realpath(path)
    try:
        with open(real, "rb") as handle:
            data = handle.read()
            st = os.fstat(handle.fileno())
    except OSError as exc:
        raise EditRefused(f"cannot read it ({exc.strerror})") from None
    if text_sha256(data) != expected_sha256:
        raise EditRefused("the file changed since this run read it; vpnw does not overwrite "
                          "an edit it has not seen")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EditRefused("the file is not UTF-8") from None
    comment = f"added by vpnw guard --ask on {today}, run {run_id}"
    new_text = with_rule(text, which, rule, comment)
    _check_still_a_policy(new_text, path)
    if new_text != text:
        _replace(real, new_text.encode("utf-8"), st)
    return text_sha256(new_text)


def _check_still_a_policy(text: str, path: str) -> None:
    from stages.config.policy import PolicyError, parse_policy
    try:
        parse_policy(text, source=path)
    except PolicyError as exc:
        raise EditRefused(f"the edited file would not be a valid policy ({exc})") from None


def _replace(real: str, data: bytes, st: os.stat_result) -> None:
    directory = os.path.dirname(real) or "."
    try:
        fd, temp = tempfile.mkstemp(prefix=".vpnw-", suffix=".toml", dir=directory)
    except OSError as exc:
        raise EditRefused(f"cannot write beside it in {directory} ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), st.st_mode & 0o7777)
            if os.geteuid() == 0:
                os.fchown(handle.fileno(), st.st_uid, st.st_gid)
            os.fsync(handle.fileno())
        os.rename(temp, real)
    except OSError as exc:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise EditRefused(f"cannot write it ({exc.strerror})") from None
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)     # the rename itself reaches the disk
        finally:
            os.close(dir_fd)
    except OSError:
        pass

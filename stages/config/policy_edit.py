"""Writing a person's answer back into the policy file (`guard --ask`).

The file is the person's: its comments, order and layout stay as they are
(tomlkit edits the document in place rather than rewriting it). The rule
goes to the end of the `allow` (or `deny`) array of [policy], on a line of
its own with a comment that says when and in which run it was added.

The program may write the directory the policy lies in (the README's own
workflow keeps it in "."), so the write never passes through a name there:
no temporary file beside it for the program to swap, and no rename over it
(a rename would also give the name a new inode, which the sandbox's
read-only bind of the old one no longer covers: the kernel detaches a mount
whose file is renamed over from outside). Instead:

- `open_place` opens the policy's directory (O_PATH) and notes the file's
  identity (device, inode) before the program starts, so a directory moved
  or replaced during the run is not followed;
- `add_rule` opens the file through that directory without following a
  link, checks it is the same regular file and still holds exactly what the
  run read (its SHA-256: a person or another run edited it meanwhile, and
  their edit is never silently overwritten), and writes the new text into
  that same inode: the bytes from the first that differs, the length, an
  fsync. The sandbox's read-only bind of the file stays in place.

The cost of writing in place: a power loss in the middle of that one small
write (usually within one page) can leave the file torn, where a rename
would have left the old file or the new one. A torn policy almost always
fails to parse (the change lands inside an array), and vpnw refuses a
policy that does not parse; the person fixes it by hand.

tomlkit is imported here only, and only when an answer is written.
"""
from __future__ import annotations

import hashlib
import os
import stat

from stages.config.policy import PolicyError, parse_policy


class EditRefused(Exception):
    """The rule was not written; str() says why, for a person."""


def text_sha256(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def with_rule(text: str, which: str, rule: str, comment: str) -> str:
    """The policy text with `rule` added to [policy]'s `which` list (pure).
    The text is returned unchanged when the list already holds the rule."""
    # tomlkit only when an answer is written (the module's doc above).
    import tomlkit
    from tomlkit.exceptions import TOMLKitError    # (the same)
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


class Place:
    """Where the policy file is: its directory's descriptor (O_PATH), its
    name there, and its identity when the run started."""

    def __init__(self, path: str, dir_fd: int, name: str, identity: tuple[int, int]):
        self.path, self.dir_fd, self.name, self.identity = path, dir_fd, name, identity

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


def open_place(path: str) -> Place:
    """The policy file's place, taken before the program starts."""
    real = os.path.realpath(path)
    directory, name = os.path.split(real)
    try:
        dir_fd = os.open(directory or "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise EditRefused(f"cannot open its directory ({exc.strerror})") from None
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        os.close(dir_fd)
        raise EditRefused(f"cannot find it ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(dir_fd)
        raise EditRefused("it is not a regular file")
    return Place(real, dir_fd, name, (st.st_dev, st.st_ino))


def add_rule(place: Place, which: str, rule: str, *, expected_sha256: str, run_id: str,
             today: str) -> str:
    """Add `rule` to the policy file at `place` if it is still the file the
    run read (the same inode, its SHA-256 `expected_sha256`). Returns the
    new text's SHA-256 (the next answer of the same run compares against it)."""
    try:
        fd = os.open(place.name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                     | os.O_NOCTTY, dir_fd=place.dir_fd)
    except OSError as exc:
        raise EditRefused(f"cannot open it for writing ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != place.identity:
            raise EditRefused("it is no longer the file this run read (it was replaced)")
        if st.st_size > MAX_POLICY:
            raise EditRefused("it is larger than a policy file should be")
        data = os.pread(fd, MAX_POLICY + 1, 0)
        if text_sha256(data) != expected_sha256:
            raise EditRefused("the file changed since this run read it; vpnw does not overwrite "
                              "an edit it has not seen")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise EditRefused("the file is not UTF-8") from None
        comment = f"added by vpnw guard --ask on {today}, run {run_id}"
        new_text = with_rule(text, which, rule, comment)
        _check_still_a_policy(new_text, place.path)
        if new_text != text:
            _write_in_place(fd, data, new_text.encode("utf-8"))
        return text_sha256(new_text)
    finally:
        os.close(fd)


MAX_POLICY = 1 << 20


def _check_still_a_policy(text: str, path: str) -> None:
    try:
        parse_policy(text, source=path)
    except PolicyError as exc:
        raise EditRefused(f"the edited file would not be a valid policy ({exc})") from None


def _write_in_place(fd: int, old: bytes, new: bytes) -> None:
    """`new` into the file that holds `old`: from the first byte that
    differs, then the length, then fsync."""
    same = 0
    for a, b in zip(old, new):
        if a != b:
            break
        same += 1
    view = memoryview(new)[same:]
    offset = same
    try:
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n
        os.ftruncate(fd, len(new))
        os.fsync(fd)
    except OSError as exc:
        raise EditRefused(f"cannot write it ({exc.strerror}); look at it before the next run") \
            from None

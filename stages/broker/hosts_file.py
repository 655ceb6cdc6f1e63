"""Names the machine answers from /etc/hosts, without a thread.

getaddrinfo blocks, so the broker runs it in a worker thread: about a third
of a millisecond a connection of hand-over alone, for an answer that, for a
name in /etc/hosts, is a dictionary lookup. When the machine's name service
asks its files first (`hosts: files ...` in /etc/nsswitch.conf, as Debian's
does), a name the hosts file holds is answered from it here, with every
address the file gives it in the file's order (glibc's `multi on`, Debian's
default); any other name still goes to getaddrinfo. The file is read again
when it changes: its stamp is looked at (a stat) at most once a second, not
on every lookup.

`parse_hosts` is pure; `HostsFile` is the thin shell that reads the files.
"""
from __future__ import annotations

import ipaddress
import os
import time

HOSTS = "/etc/hosts"
NSSWITCH = "/etc/nsswitch.conf"
RECHECK_AFTER = 1.0     # seconds an answer is trusted before the file's stamp is looked at again


def parse_hosts(text: str) -> dict[str, tuple]:
    """hosts(5) text -> {lower-case name: (address, ...)} in file order.
    Lines that do not start with an address are skipped, as glibc does."""
    names: dict[str, list] = {}
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        try:
            address = ipaddress.ip_address(fields[0])
        except ValueError:
            continue
        if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
            continue    # a zone id names an interface of this machine; never dialled
        for name in fields[1:]:
            found = names.setdefault(name.lower().rstrip("."), [])
            if address not in found:
                found.append(address)
    return {name: tuple(found) for name, found in names.items()}


def files_first(nsswitch_text: str) -> bool:
    """Whether the `hosts:` line of nsswitch.conf consults files first."""
    for line in nsswitch_text.splitlines():
        fields = line.split("#", 1)[0].split()
        if fields and fields[0] == "hosts:":
            return len(fields) > 1 and fields[1] == "files"
    return False


class HostsFile:
    """The machine's /etc/hosts, when its name service reads it first."""

    def __init__(self, path: str = HOSTS, nsswitch: str = NSSWITCH, *,
                 recheck_after: float = RECHECK_AFTER, clock=time.monotonic):
        self.path = path
        self.recheck_after = recheck_after
        self.clock = clock
        self._checked_at: float | None = None
        try:
            with open(nsswitch) as f:
                self.enabled = files_first(f.read())
        except OSError:
            self.enabled = False
        self._stamp = None
        self._names: dict[str, tuple] = {}
        self._texts: dict[str, list[str]] = {}

    def lookup(self, name: str) -> tuple:
        """The file's addresses for `name` (canonical: lower case, no
        trailing dot); () when the file does not hold it (or is not used)."""
        if not self.enabled:
            return ()
        now = self.clock()
        if self._checked_at is None or now - self._checked_at >= self.recheck_after:
            self._checked_at = now
            self._read_if_changed()
        return self._names.get(name, ())

    def texts(self, name: str) -> list[str]:
        """lookup(name)'s addresses as text, as the record writes them
        (after a lookup; made once per file, not per connection)."""
        found = self._texts.get(name)
        if found is None:
            found = self._texts[name] = [str(a) for a in self._names.get(name, ())]
        return found

    def _read_if_changed(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._stamp, self._names, self._texts = None, {}, {}
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                with open(self.path, encoding="utf-8", errors="replace") as f:
                    self._names = parse_hosts(f.read())
            except OSError:
                self._names = {}
            self._texts = {}
            self._stamp = stamp

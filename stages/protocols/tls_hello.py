"""A TLS ClientHello, read for its server name; and the alert vpnw answers
a refused one with (docs/architecture.md "Denials at every door").

Sans-I/O and fuzz-safe: bytes in; out, a `ClientHello`, None (send more) or
one `NotClientHello` (a sentence), never any other exception. Only the
plaintext handshake records before any key exists are read (RFC 8446
§5.1, §4.1.2; the same layout since TLS 1.0): one ClientHello may span
several records, and nothing after it is looked at.

The alert is a plaintext record too: level fatal (2), description
access_denied (49), RFC 8446 §6. It needs no key and opens nothing; a
client reports it as "alert access denied" rather than "connection reset".
"""
from __future__ import annotations

HANDSHAKE, ALERT = 22, 21
CLIENT_HELLO = 1
SERVER_NAME, HOST_NAME = 0, 0
MAX_HELLO = 64 * 1024            # far beyond any real ClientHello (post-quantum ones are ~2 KiB)
MAX_RECORD = 2 ** 14 + 256       # RFC 8446 §5.1: a plaintext record's fragment is at most 2^14

# RFC 8446 §5.1: 0x0303 for every record but an initial ClientHello.
ACCESS_DENIED_ALERT = bytes([ALERT, 3, 3, 0, 2, 2, 49])


class NotClientHello(Exception):
    """The bytes are not the start of a TLS ClientHello; str() says why."""


class ClientHello(tuple):
    """(server_name or None, the bytes it took)."""
    __slots__ = ()

    def __new__(cls, server_name, size):
        return tuple.__new__(cls, (server_name, size))

    server_name = property(lambda self: self[0])
    size = property(lambda self: self[1])


def looks_like_tls(data: bytes) -> bool:
    """Whether the first bytes could start a TLS handshake record."""
    return len(data) >= 1 and data[0] == HANDSHAKE and (len(data) < 2 or data[1] == 3)


def read_client_hello(data: bytes) -> ClientHello | None:
    """The ClientHello at the start of `data`, None when more bytes are
    needed, or NotClientHello."""
    message, at = b"", 0
    needed = None
    while needed is None or len(message) < needed:
        if at + 5 > len(data):
            return _more(at)
        kind, major, _minor, length = data[at], data[at + 1], data[at + 2], \
            int.from_bytes(data[at + 3:at + 5], "big")
        if kind != HANDSHAKE:
            raise NotClientHello(f"a TLS record of type {kind}, not a handshake")
        if major != 3:
            raise NotClientHello(f"a record version {major}.x, not TLS")
        if length == 0 or length > MAX_RECORD:
            raise NotClientHello(f"a handshake record of {length} bytes")
        if at + 5 + length > len(data):
            return _more(at + 5 + length)
        message += data[at + 5:at + 5 + length]
        at += 5 + length
        if needed is None and len(message) >= 4:
            if message[0] != CLIENT_HELLO:
                raise NotClientHello(f"a handshake message of type {message[0]}, not a ClientHello")
            needed = 4 + int.from_bytes(message[1:4], "big")
            if needed > MAX_HELLO:
                raise NotClientHello(f"a ClientHello of {needed} bytes")
    return ClientHello(_server_name(message[4:needed]), at)


def _more(size: int) -> None:
    if size > MAX_HELLO + 5 * (MAX_HELLO // MAX_RECORD + 2):
        raise NotClientHello("a ClientHello longer than any real one")
    return None


class _HelloReader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise NotClientHello("a ClientHello cut short inside")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))


def _server_name(body: bytes) -> str | None:
    r = _HelloReader(body)
    r.take(2 + 32)              # legacy_version, random
    r.vector(1)                 # legacy_session_id
    r.vector(2)                 # cipher_suites
    r.vector(1)                 # legacy_compression_methods
    if r.at == len(body):
        return None             # no extensions (an old client)
    extensions = _HelloReader(r.vector(2))
    while extensions.at < len(extensions.data):
        kind = extensions.number(2)
        value = extensions.vector(2)
        if kind != SERVER_NAME:
            continue
        names = _HelloReader(_HelloReader(value).vector(2))
        while names.at < len(names.data):
            name_type = names.number(1)
            name = names.vector(2)
            if name_type == HOST_NAME:
                try:
                    text = name.decode("ascii")
                except UnicodeDecodeError:
                    raise NotClientHello("a server name that is not ASCII") from None
                if not text or not text.isprintable() or len(text) > 255:
                    raise NotClientHello("a server name no host name could be")
                return text
    return None

"""SOCKS5 door (RFC 1928): a sans-I/O server-side parser.

Feed the client's bytes; `next_event()` returns one of:

* `NEED_DATA`;
* `Greeted(reply)`: the client offered no-auth; send `reply` and go on;
* `NoAcceptableMethod(reply)`: send `reply` (0x05 0xFF) and close;
* `ConnectRequest(host, port, address_type)`: decide, dial, then send
  `reply(code, bound)`; bytes the client sent ahead are in `early_data()`;
* `SocksRefused(reply, reason)`: a request we answer with an error (BIND and UDP
  ASSOCIATE: 0x07; unknown address type: 0x08), then close.

Anything else malformed raises `Socks5Error` and nothing else. Only version
5 is spoken: SOCKS4/4a clients get the connection closed.
"""
from __future__ import annotations

import ipaddress
import struct

from stages.startup.records import NamedTuple   # not dataclasses: the loop's import (records.py)
from stages.broker.sans_io import NEED_DATA  # noqa: F401 - one sentinel for both doors' parsers

VERSION = 5
NO_AUTH = 0x00
NO_ACCEPTABLE = 0xFF

CMD_CONNECT, CMD_BIND, CMD_UDP = 1, 2, 3
ATYP_IPV4, ATYP_DOMAIN, ATYP_IPV6 = 1, 3, 4

SUCCEEDED = 0x00
GENERAL_FAILURE = 0x01
NOT_ALLOWED = 0x02
NETWORK_UNREACHABLE = 0x03
HOST_UNREACHABLE = 0x04
CONNECTION_REFUSED = 0x05
TTL_EXPIRED = 0x06
COMMAND_NOT_SUPPORTED = 0x07
ADDRESS_TYPE_NOT_SUPPORTED = 0x08


class Socks5Error(Exception):
    """Malformed SOCKS5; `reply_code` is the answer to give when we are past
    the greeting (None: just close)."""

    def __init__(self, reason: str, reply_code: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.reply_code = reply_code


class Greeted(NamedTuple):
    reply: bytes


class NoAcceptableMethod(NamedTuple):
    reply: bytes


class ConnectRequest(NamedTuple):
    host: str            # domain name as sent, or the address in text form
    port: int
    address_type: int    # ATYP_IPV4 / ATYP_DOMAIN / ATYP_IPV6


class SocksRefused(NamedTuple):
    reply: bytes
    reason: str


def reply(code: int, bound: tuple[str, int] | None = None) -> bytes:
    """The server's answer to a request. `bound` is the address the broker
    connected from (clients rarely use it); 0.0.0.0:0 when there is none."""
    host, port = bound if bound else ("0.0.0.0", 0)
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        address = ipaddress.IPv4Address(0)
    if address.version == 4:
        body = bytes([ATYP_IPV4]) + address.packed
    else:
        body = bytes([ATYP_IPV6]) + address.packed
    return bytes([VERSION, code, 0]) + body + struct.pack("!H", port & 0xFFFF)


class Socks5Parser:
    def __init__(self):
        self._buf = bytearray()
        self._state = "greeting"   # greeting | request | done

    def feed(self, data: bytes) -> None:
        if self._state == "done":
            self._buf += data      # early tunnel data
            return
        self._buf += data
        if len(self._buf) > 1024 * 1024:
            raise Socks5Error("too much data before the request was answered")

    def early_data(self) -> bytes:
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def next_event(self):
        if self._state == "greeting":
            return self._greeting()
        if self._state == "request":
            return self._request()
        raise Socks5Error("the handshake is over")

    def _greeting(self):
        buf = self._buf
        if not buf:
            return NEED_DATA
        if buf[0] != VERSION:
            raise Socks5Error(f"not SOCKS version 5 (first byte {buf[0]:#04x})")
        if len(buf) < 2:
            return NEED_DATA
        count = buf[1]
        if len(buf) < 2 + count:
            return NEED_DATA
        methods = bytes(buf[2:2 + count])
        del buf[:2 + count]
        if NO_AUTH not in methods:
            self._state = "done"
            return NoAcceptableMethod(bytes([VERSION, NO_ACCEPTABLE]))
        self._state = "request"
        return Greeted(bytes([VERSION, NO_AUTH]))

    def _request(self):
        buf = self._buf
        if buf[:1] and buf[0] != VERSION:
            raise Socks5Error("request is not SOCKS version 5", GENERAL_FAILURE)
        if len(buf) < 4 or (len(buf) < 5 and buf[3] == ATYP_DOMAIN):
            return NEED_DATA
        version, command, reserved, atyp = buf[0], buf[1], buf[2], buf[3]
        if version != VERSION:
            raise Socks5Error("request is not SOCKS version 5", GENERAL_FAILURE)
        if reserved != 0:
            raise Socks5Error("reserved byte is not zero", GENERAL_FAILURE)
        if atyp == ATYP_IPV4:
            need = 4 + 4 + 2
        elif atyp == ATYP_IPV6:
            need = 4 + 16 + 2
        elif atyp == ATYP_DOMAIN:
            need = 4 + 1 + buf[4] + 2
        else:
            self._state = "done"
            return SocksRefused(reply(ADDRESS_TYPE_NOT_SUPPORTED),
                           f"address type {atyp:#04x} is not supported")
        if len(buf) < need:
            return NEED_DATA
        raw = bytes(buf[4:need - 2])
        (port,) = struct.unpack("!H", buf[need - 2:need])
        del buf[:need]
        self._state = "done"
        if command != CMD_CONNECT:
            name = {CMD_BIND: "BIND", CMD_UDP: "UDP ASSOCIATE"}.get(command, f"command {command:#04x}")
            return SocksRefused(reply(COMMAND_NOT_SUPPORTED), f"{name} is not supported")
        if atyp == ATYP_IPV4:
            host = str(ipaddress.IPv4Address(raw))
        elif atyp == ATYP_IPV6:
            host = str(ipaddress.IPv6Address(raw))
        else:
            name = raw[1:]
            if not name:
                raise Socks5Error("empty domain name", GENERAL_FAILURE)
            try:
                host = name.decode("utf-8")
            except UnicodeDecodeError:
                raise Socks5Error("domain name is not UTF-8", GENERAL_FAILURE) from None
        return ConnectRequest(host, port, atyp)

"""Reading back what the DNS door writes, for the tests."""
from __future__ import annotations

import struct

from stages.protocols import dns


def extended_error(data: bytes) -> tuple[int, str] | None:
    """The Extended DNS Error (info-code, text) of an answer, or None. Never
    raises. vpnw only writes these (the DNS door's refusals); the tests read
    them back."""
    try:
        _, _, qdcount, ancount, nscount, arcount = struct.unpack_from("!HHHHHH", data)
        at = 12
        for _ in range(qdcount):
            at = dns._skip_name(data, at) + 4
        for _ in range(ancount + nscount):
            at = dns._skip_name(data, at)
            at += 10 + struct.unpack_from("!H", data, at + 8)[0]
        for _ in range(arcount):
            at = dns._skip_name(data, at)
            rtype, _, _, length = struct.unpack_from("!HHIH", data, at)
            at += 10
            if rtype == dns.OPT:
                end = at + length
                while at + 4 <= end:
                    code, size = struct.unpack_from("!HH", data, at)
                    if code == dns.EDE and size >= 2:
                        info = struct.unpack_from("!H", data, at + 4)[0]
                        return info, data[at + 6:at + 4 + size].decode("utf-8", "replace")
                    at += 4 + size
                return None
            at += length
    except (struct.error, dns.DnsAnswerError, IndexError):
        return None
    return None

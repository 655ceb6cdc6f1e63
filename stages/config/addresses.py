"""Host strings and special addresses: the shared vocabulary of the policy.

Two pure functions:

- `parse_host` turns what a client asked for into one canonical form: a name
  (IDNA A-labels, lower case, no trailing dot) or an IP address. Anything a
  resolver or a URL parser might read in more than one way is refused here,
  before any look-up: names made only of digits (`2130706433`), every IPv4
  spelling that is not plain dotted decimal (`0x7f.1`, `0177.0.0.1`, `127.1`,
  `10.0.0.010`, `1.2.3.4.`), IPv6 zone ids, characters no host name holds,
  labels over 63 and names over 253 characters.
- `classify` says why an address is special (the `deny_private` check), or
  returns None for an ordinary public address.

Names must be ASCII. A name with any other character (`bücher.example`,
a full-width `ｅｖｉｌ.example`, a circled `ⓔⓥⓘⓛ.example`, `evil。example`
with an ideographic full stop) is refused, in requests and in rules alike,
never mapped: clients convert an internationalised name to its A-label
(`xn--bcher-kva.example`) before they ask a proxy, and that A-label is what
the DNS looks up, so it is what the policy judges. Mapping (IDNA 2003 here,
IDNA 2008 / UTS 46 in clients) would let two spellings that the two standards
map differently (`faß.de`) stand for different names on either side of a
rule; refusing leaves one spelling per name.

`classify_name` is the by-name half of deny_private: names that by
definition stay on this machine or inside a private network (RFC 6761
localhost, RFC 6762 .local, RFC 8375 home.arpa, ICANN's .internal, the
common .localdomain, single-label names, the cloud providers' metadata host
names), refused before any look-up. `.example`, `.test` and `.invalid` are
not among them: RFC 6761 asks applications not to treat those specially.

The special-purpose table is written by hand from the IANA IPv4 and IPv6
Special-Purpose Address Registries (plus multicast, reserved space and
deprecated ranges). We do not use `ipaddress.is_global`/`is_private`: they
pass 192.0.0.192 (an old cloud metadata address), multicast, site-local
fec0::/10 and several IPv6 embeddings of IPv4.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

IPAddress = IPv4Address | IPv6Address

MAX_NAME = 253
MAX_LABEL = 63


class BadHost(ValueError):
    """A host string we refuse to interpret; str() is the reason sentence."""


# --- parse_host ------------------------------------------------------------

_DOTTED_QUAD = re.compile(r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
                          r"(?:\.(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}")
# A label that a URL parser (WHATWG "ends in a number") or inet_aton would read
# as a number: decimal, octal with a leading 0, or hexadecimal with 0x.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9a-fA-F]*")
_LABEL_CHARS = re.compile(r"[a-z0-9_-]+")
_ASCII_ALLOWED = re.compile(r"[A-Za-z0-9._-]*")


def _describe_char(ch: str) -> str:
    if ch == "\x00":
        return "a NUL byte"
    if ch == " ":
        return "a space"
    if ch == "%":
        return '"%" (a zone id or percent-encoding)'
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"a control character (U+{ord(ch):04X})"
    return f'"{ch}"'


def _parse_ipv6(text: str) -> IPv6Address:
    if "%" in text:
        raise BadHost(f"{text!r}: an IPv6 zone id (after %) names an interface of this machine; "
                      "zone ids are refused")
    try:
        return IPv6Address(text)
    except ValueError:
        raise BadHost(f"{text!r} is not a valid IPv6 address") from None


def parse_host(host: str) -> str | IPv4Address | IPv6Address:
    """Canonical name or IP address for `host`, or BadHost(reason).

    `[2001:db8::1]` (brackets, as in a URL authority) is read as IPv6.
    """
    if not isinstance(host, str):
        raise BadHost("a host must be text")
    if host == "":
        raise BadHost("the host is empty")
    if len(host) > 1024:
        raise BadHost("the host is longer than any DNS name (253 characters)")
    if host.startswith("[") and host.endswith("]"):
        return _parse_ipv6(host[1:-1])
    if ":" in host:
        return _parse_ipv6(host)

    if not host.isascii():
        bad = next(c for c in host if not c.isascii())
        raise BadHost(f"{host!r} holds {_describe_char(bad)} (U+{ord(bad):04X}), which is not ASCII; "
                      "names are judged in the ASCII form clients send (an IDNA A-label, xn--...)")
    if not _ASCII_ALLOWED.fullmatch(host):
        bad = next(c for c in host if not _ASCII_ALLOWED.fullmatch(c))
        raise BadHost(f"{host!r} holds {_describe_char(bad)}, which no host name may hold")
    name = host.lower()

    trailing_dot = name.endswith(".")
    bare = name[:-1] if trailing_dot else name
    if bare == "":
        raise BadHost(f"{host!r} is not a host name")
    labels = bare.split(".")

    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        # Ends in a number: resolvers and URL parsers read this as an IPv4
        # address. Only the plain dotted-decimal spelling is accepted.
        if not trailing_dot and host.isascii() and _DOTTED_QUAD.fullmatch(bare):
            return IPv4Address(bare)
        if len(labels) == 1 and labels[0].isdigit():
            raise BadHost(f"{host!r} is a host name made only of digits, which resolvers read "
                          "as an IPv4 address written as one number; refused")
        raise BadHost(f"{host!r} is not the dotted-decimal spelling of an IPv4 address "
                      "(octal, hexadecimal, short forms and trailing dots are read differently "
                      "by different programs); refused")

    if len(bare) > MAX_NAME:
        raise BadHost(f"{host!r} is longer than {MAX_NAME} characters, the limit for a DNS name")
    for label in labels:
        if label == "":
            raise BadHost(f"{host!r} has an empty label (two dots in a row, or a leading dot)")
        if len(label) > MAX_LABEL:
            raise BadHost(f"{host!r} has a label longer than {MAX_LABEL} characters")
        if not _LABEL_CHARS.fullmatch(label):
            raise BadHost(f"{host!r} holds characters no host name may hold")
        if label.startswith("-") or label.endswith("-"):
            raise BadHost(f"{host!r} has a label that starts or ends with a hyphen")
    return bare


# --- classify_name -------------------------------------------------------------

# Names below these suffixes (and the suffix itself) never name a host on the
# internet. Each reason names its source.
_SPECIAL_SUFFIXES: dict[str, str] = {
    "localhost": "a name for this machine's own loopback (RFC 6761 reserves localhost "
                 "and every name below it)",
    "local": "a link-local Multicast DNS name (RFC 6762 reserves .local for the local link)",
    "home.arpa": "a name inside a home network (RFC 8375 reserves home.arpa for it)",
    "internal": "a name inside a private network (ICANN reserved .internal for private use, 2024)",
    "localdomain": "a name for this machine in common host files (localdomain is not a "
                   "top-level domain of the DNS)",
}
# Exact names with a reason of their own, from the providers' documentation.
# Azure documents its metadata and platform services only by address
# (169.254.169.254, 168.63.129.16), which classify() refuses; metadata.azure.com
# is the name in the certificate that signs Azure's attested data, a public
# name, not a metadata host.
_SPECIAL_NAMES: dict[str, str] = {
    "metadata.google.internal": "the cloud metadata server's name on Google Cloud "
                                "(Compute Engine documentation, 169.254.169.254)",
    "metadata": "the cloud metadata server's short name on Google Cloud "
                "(Compute Engine documentation: http://metadata/computeMetadata/v1/)",
    "instance-data": "the instance metadata service's name on Amazon EC2 "
                     "(EC2 documentation: http://instance-data/latest/meta-data/)",
    "instance-data.ec2.internal": "the instance metadata service's name on Amazon EC2 "
                                  "(EC2 documentation, in the us-east-1 search domain)",
    "localhost.localdomain": "a name for this machine in common host files (127.0.0.1)",
}
# The last label of every special name with a dot in it.
SPECIAL_LAST_LABELS = frozenset(name.rsplit(".", 1)[-1] for name in (*_SPECIAL_SUFFIXES, *_SPECIAL_NAMES)
                                 if "." in name) | frozenset(s for s in _SPECIAL_SUFFIXES if "." not in s)
_SINGLE_LABEL = ("a single-label name, which a resolver's search list completes into a "
                 "name of the local network")


def classify_name(name: str) -> str | None:
    """Why the canonical name `name` (parse_host's output) stays on this
    machine or inside a private network, as a sentence, or None.

    Cheap on purpose: it runs before every look-up under deny_private."""
    dot = name.rfind(".")
    if dot == -1:
        return _SPECIAL_NAMES.get(name) or _SPECIAL_SUFFIXES.get(name, _SINGLE_LABEL)
    last = name[dot + 1:]
    if last not in SPECIAL_LAST_LABELS:
        return None                      # almost every name: one set look-up
    why = _SPECIAL_NAMES.get(name) or _SPECIAL_SUFFIXES.get(last)
    if why is None:                      # .arpa: only home.arpa is special
        second = name.rfind(".", 0, dot)
        why = _SPECIAL_SUFFIXES.get(name[second + 1:])
    return why


# --- classify ---------------------------------------------------------------

# (network, what it is, why it matters, RFC). Order matters: the first match
# wins, so narrower entries come before the ranges that contain them.
_IPV4_SPECIAL: tuple[tuple[str, str, str, str], ...] = (
    ("0.0.0.0/32", "unspecified address", "which Linux connects to this machine itself", "RFC 1122"),
    ("0.0.0.0/8", '"this network" address', "which never names a remote host", "RFC 791"),
    ("10.0.0.0/8", "private address", "inside a private network, not on the internet", "RFC 1918"),
    ("100.64.0.0/10", "shared address (carrier-grade NAT)",
     "inside a provider's network, where some cloud metadata services live (100.100.100.200)",
     "RFC 6598"),
    ("127.0.0.0/8", "loopback address", "which reaches services on this machine", "RFC 1122"),
    ("169.254.0.0/16", "link-local address", "where cloud metadata services live", "RFC 3927"),
    ("172.16.0.0/12", "private address", "inside a private network, not on the internet", "RFC 1918"),
    ("192.0.0.192/32", "IETF protocol assignment",
     "where a cloud metadata service lives (Oracle Cloud)", "RFC 6890"),
    ("192.0.0.0/29", "IPv4 service continuity prefix (DS-Lite)",
     "used inside a provider's network", "RFC 7335"),
    ("192.0.0.170/31", "NAT64/DNS64 discovery address", "which is not a real host", "RFC 8880"),
    ("192.0.0.0/24", "IETF protocol assignment address",
     "reserved for protocols, not ordinary hosts", "RFC 6890"),
    ("192.0.2.0/24", "documentation address (TEST-NET-1)", "which no real host uses", "RFC 5737"),
    ("192.31.196.0/24", "AS112 anycast address", "a sink for stray reverse look-ups", "RFC 7535"),
    ("192.52.193.0/24", "AMT relay anycast address", "for multicast tunnelling, not ordinary hosts",
     "RFC 7450"),
    ("192.88.99.0/24", "deprecated 6to4 relay anycast address",
     "which relays into other networks", "RFC 7526"),
    ("192.168.0.0/16", "private address", "inside a private network, not on the internet",
     "RFC 1918"),
    ("192.175.48.0/24", "AS112 direct delegation address", "a sink for stray reverse look-ups",
     "RFC 7534"),
    ("198.18.0.0/15", "benchmarking address", "for lab networks, not the internet", "RFC 2544"),
    ("198.51.100.0/24", "documentation address (TEST-NET-2)", "which no real host uses",
     "RFC 5737"),
    ("203.0.113.0/24", "documentation address (TEST-NET-3)", "which no real host uses",
     "RFC 5737"),
    ("224.0.0.0/4", "multicast address", "which reaches groups of hosts on local networks",
     "RFC 5771"),
    ("255.255.255.255/32", "limited broadcast address", "which reaches every host on the local network",
     "RFC 919"),
    ("240.0.0.0/4", "reserved address", "which is not assigned to the internet", "RFC 1112"),
)

# IPv6 entries. Embeddings of IPv4 are handled in code before this table.
_IPV6_SPECIAL: tuple[tuple[str, str, str, str], ...] = (
    ("::/128", "unspecified address", "which Linux connects to this machine itself", "RFC 4291"),
    ("::1/128", "loopback address", "which reaches services on this machine", "RFC 4291"),
    ("::/96", "deprecated IPv4-compatible IPv6 address",
     "an IPv4 embedding that some stacks route to the IPv4 address inside", "RFC 4291"),
    ("::ffff:0:0:0/96", "IPv4-translated IPv6 address",
     "an IPv4 embedding that translators route to the IPv4 address inside", "RFC 2765"),
    ("100::/64", "discard-only address", "which goes nowhere", "RFC 6666"),
    ("100:0:0:1::/64", "dummy IPv6 prefix", "which is not a real host", "RFC 9780"),
    ("2001::/32", "Teredo address", "a tunnel that carries IPv4 addresses into other networks",
     "RFC 4380"),
    ("2001:2::/48", "benchmarking address", "for lab networks, not the internet", "RFC 5180"),
    ("2001:10::/28", "deprecated ORCHID address", "which is not routable", "RFC 4843"),
    ("2001::/23", "IETF protocol assignment address", "reserved for protocols, not ordinary hosts",
     "RFC 2928"),
    ("2001:db8::/32", "documentation address", "which no real host uses", "RFC 3849"),
    ("2002::/16", "6to4 address", "a tunnel that carries IPv4 addresses into other networks",
     "RFC 3056"),
    ("2620:4f:8000::/48", "AS112 direct delegation address", "a sink for stray reverse look-ups",
     "RFC 7534"),
    ("3fff::/20", "documentation address", "which no real host uses", "RFC 9637"),
    ("5f00::/16", "segment routing SID address", "inside an operator's network", "RFC 9602"),
    ("fc00::/7", "unique local address",
     "inside a private network, where some cloud metadata services live (fd00:ec2::254)",
     "RFC 4193"),
    ("fe80::/10", "link-local address", "on the local link only", "RFC 4291"),
    ("fec0::/10", "deprecated site-local address", "inside a private site", "RFC 3879"),
    ("ff00::/8", "multicast address", "which reaches groups of hosts on local networks",
     "RFC 4291"),
    # Everything outside global unicast space is reserved or unassigned.
    ("::/0", "address outside IPv6 global unicast space (2000::/3)",
     "which is reserved, not assigned to the internet", "RFC 4291"),
)


def _table(entries, network_type):
    return tuple((network_type(net), what, why, rfc) for net, what, why, rfc in entries)


IPV4_SPECIAL = _table(_IPV4_SPECIAL, IPv4Network)
# Cloud platform services at addresses no RFC reserves: deny_private refuses
# them too, since a program on such a cloud VM reaches them like metadata.
CLOUD_PLATFORM_V4 = _table((
    ("168.63.129.16/32", "platform address of Azure (WireServer)",
     "where Azure's VM agent, DNS and metadata services live", "Azure documentation"),
), IPv4Network)
IPV6_SPECIAL = _table(_IPV6_SPECIAL, IPv6Network)


class _PrefixTable:
    """Longest-prefix match over a special table: one dict look-up per prefix
    length present, not one containment test per entry. The tables above are
    written so that a narrower entry always wins over a wider one, which is
    exactly what longest-prefix-first gives."""

    def __init__(self, table, bits: int):
        self.bits = bits
        self.by_length: dict[int, dict[int, tuple]] = {}
        for entry in table:
            net = entry[0]
            if net.prefixlen == 0:
                continue                      # the IPv6 catch-all is handled in code
            self.by_length.setdefault(net.prefixlen, {}).setdefault(int(net.network_address), entry)
        self.lengths = sorted(self.by_length, reverse=True)

    def find(self, value: int):
        for length in self.lengths:
            shift = self.bits - length
            entry = self.by_length[length].get(value >> shift << shift)
            if entry is not None:
                return entry
        return None


_V4_TABLE = _PrefixTable(IPV4_SPECIAL + CLOUD_PLATFORM_V4, 32)
_V6_TABLE = _PrefixTable(IPV6_SPECIAL, 128)
_RESERVED_V6 = next(e for e in IPV6_SPECIAL if e[0].prefixlen == 0)

_MAPPED = IPv6Network("::ffff:0:0/96")
_NAT64 = IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = IPv6Network("64:ff9b:1::/48")
_NAT64_LOCAL_96 = IPv6Network("64:ff9b:1::/96")
_EMBEDDING_PREFIXES = frozenset(int(n.network_address) >> 32 for n in (_MAPPED, _NAT64, _NAT64_LOCAL_96))


def embedded_ipv4(ip: IPv6Address) -> tuple[IPv4Address, str] | None:
    """The IPv4 address an IPv6 address stands for, when it is one whose
    traffic goes to that IPv4 address (IPv4-mapped, NAT64): (ipv4, description)."""
    top = int(ip) >> 32
    if top not in _EMBEDDING_PREFIXES:
        return None
    if ip in _MAPPED:
        return IPv4Address(int(ip) & 0xFFFFFFFF), "IPv4-mapped IPv6 address (::ffff:0:0/96)"
    if ip in _NAT64:
        return IPv4Address(int(ip) & 0xFFFFFFFF), "NAT64 address (64:ff9b::/96, RFC 6052)"
    if ip in _NAT64_LOCAL_96:
        return IPv4Address(int(ip) & 0xFFFFFFFF), "local-use NAT64 address (64:ff9b:1::/48, RFC 8215)"
    return None


def _as_ip(ip) -> IPAddress:
    if isinstance(ip, (IPv4Address, IPv6Address)):
        if isinstance(ip, IPv6Address) and ip.scope_id:
            return IPv6Address(int(ip))
        return ip
    if isinstance(ip, str):
        return _as_ip(ipaddress.ip_address(ip))
    raise TypeError(f"not an IP address: {ip!r}")


def _a(phrase: str) -> str:
    return ("an " if phrase[:1] in "aeiou" else "a ") + phrase


def _classify_v4(ip: IPv4Address) -> str | None:
    entry = _V4_TABLE.find(int(ip))
    if entry is None:
        return None
    net, what, why, _ = entry
    return f"{what} ({net}), {why}"


def _isatap_ipv4(ip: IPv6Address) -> IPv4Address | None:
    # ISATAP interface ids (::0:5efe:a.b.c.d, ::200:5efe:a.b.c.d) carry the
    # IPv4 address of a tunnel end point; that end point may sit inside.
    if (int(ip) >> 32) & 0xFDFFFFFF == 0x00005EFE:
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def classify(ip, local_addresses: Iterable = frozenset()) -> str | None:
    """Why `ip` is special, as a sentence starting with the address, or None.

    `local_addresses`: the addresses of this machine's own interfaces (the
    caller collects them; this module does no I/O).
    """
    ip = _as_ip(ip)
    local = local_addresses if isinstance(local_addresses, (set, frozenset)) else frozenset(local_addresses)
    # The range's own reason comes first, so 127.0.0.1 reads "loopback" on every
    # machine; "own interfaces" is for addresses no range refuses (a public one).
    why = _classify_special(ip, local)
    if why is not None:
        return why
    if local and ip in local:
        return (f"{ip}: an address of this machine's own interfaces, "
                "which reaches services listening here")
    embedded = embedded_ipv4(ip) if isinstance(ip, IPv6Address) else None
    if embedded is not None and embedded[0] in local:
        return f"{ip}: {embedded[1]} carrying {embedded[0]}, an address of this machine's own interfaces"
    return None


def _classify_special(ip, local: frozenset) -> str | None:
    if isinstance(ip, IPv4Address):
        why = _classify_v4(ip)
        return f"{ip}: {why}" if why else None

    embedded = embedded_ipv4(ip)
    if embedded is not None:
        v4, what = embedded
        why = _classify_v4(v4)
        return f"{ip}: {what} carrying {v4}, {_a(why)}" if why else None
    if ip in _NAT64_LOCAL:
        return (f"{ip}: local-use NAT64 address ({_NAT64_LOCAL}) in a layout that does not show "
                "which IPv4 address it carries, so it cannot be checked; refused (RFC 8215)")
    entry = _V6_TABLE.find(int(ip))
    if entry is None and int(ip) >> 125 != 0b001:          # outside 2000::/3
        entry = _RESERVED_V6
    if entry is not None:
        net, what, why, _ = entry
        return f"{ip}: {what} ({net}), {why}"
    isatap = _isatap_ipv4(ip)
    if isatap is not None:
        why = _classify_v4(isatap) or ("an address of this machine's own interfaces"
                                       if isatap in local else None)
        if why:
            return f"{ip}: ISATAP address carrying {isatap}, {_a(why)}"
    return None


# --- the machine itself ------------------------------------------------------

# What vpnw never dials without a rule naming it, policy or not
# (docs/architecture.md "The machine itself"): the machine's loopback, its
# own interface addresses, the link-local ranges and the cloud metadata
# addresses. Kinds: "loopback" (opened only by the door `localhost:PORT`),
# "own", "link-local", "metadata" (opened by an address allow rule).
_MACHINE_V4 = (
    (IPv4Network("127.0.0.0/8"), "loopback", "the machine's own loopback (127.0.0.0/8)"),
    (IPv4Network("0.0.0.0/8"), "loopback",
     'the "this network" block (0.0.0.0/8; Linux connects 0.0.0.0 to this machine itself)'),
    (IPv4Network("169.254.169.254/32"), "metadata",
     "the cloud metadata service's address (169.254.169.254: AWS, Google Cloud, Azure...)"),
    (IPv4Network("169.254.0.0/16"), "link-local",
     "a link-local address (169.254.0.0/16), where cloud metadata and other platform services live"),
    (IPv4Network("100.100.100.200/32"), "metadata",
     "the cloud metadata service's address on Alibaba Cloud (100.100.100.200)"),
    (IPv4Network("192.0.0.192/32"), "metadata",
     "the cloud metadata service's address on Oracle Cloud (192.0.0.192)"),
    (IPv4Network("168.63.129.16/32"), "metadata",
     "Azure's platform address (168.63.129.16: WireServer, its VM agent and metadata)"),
)
_MACHINE_V6 = (
    (IPv6Network("::1/128"), "loopback", "the machine's own loopback (::1)"),
    (IPv6Network("::/128"), "loopback",
     "the unspecified address (::; Linux connects it to this machine itself)"),
    (IPv6Network("fd00:ec2::254/128"), "metadata",
     "the cloud metadata service's IPv6 address on AWS (fd00:ec2::254)"),
    (IPv6Network("fe80::/10"), "link-local", "a link-local address (fe80::/10), on the local link only"),
)
MACHINE_KINDS = ("loopback", "own", "link-local", "metadata")


class MachineAddress(tuple):
    """(kind, the address judged, what it is as a phrase)."""
    __slots__ = ()

    def __new__(cls, kind: str, address, what: str):
        return tuple.__new__(cls, (kind, address, what))

    kind = property(lambda self: self[0])
    address = property(lambda self: self[1])
    what = property(lambda self: self[2])


def machine_address(ip, local_addresses: Iterable = frozenset()) -> MachineAddress | None:
    """Whether `ip` reaches this machine itself or its link (see above): a
    MachineAddress, or None. An IPv4-mapped or NAT64 address is judged by
    the IPv4 address it carries (the safe side). `local_addresses`: this
    machine's own interface addresses (the caller collects them)."""
    ip = _as_ip(ip)
    carried = embedded_ipv4(ip) if isinstance(ip, IPv6Address) else None
    for candidate in ((ip, carried[0]) if carried else (ip,)):
        table = _MACHINE_V4 if isinstance(candidate, IPv4Address) else _MACHINE_V6
        for network, kind, what in table:
            if candidate in network:
                return MachineAddress(kind, candidate, what)
        if candidate in local_addresses:
            return MachineAddress("own", candidate, "an address of this machine's own interfaces")
    return None


def machine_name(name: str) -> str | None:
    """Why the canonical name `name` is the machine's own loopback by
    definition (RFC 6761: localhost and every name below it), or None.
    Such a name is refused before any look-up; the door `localhost:PORT`
    is its only way."""
    if name == "localhost" or name.endswith(".localhost") or name == "localhost.localdomain":
        return _SPECIAL_SUFFIXES["localhost"] if name != "localhost.localdomain" else \
            _SPECIAL_NAMES["localhost.localdomain"]
    return None

"""The WireGuard configuration a VPN hands its users (wg-quick format), read
for a `type = "wireguard"` path. Sans-I/O: `parse_wg_quick(text, source)`
takes the file's text and returns a `WgConf`, or raises errors.ConfigError
naming the file and line and the fix (exit 121).

    [Interface]
    PrivateKey = <base64>
    Address = 10.66.0.2/32, fd00::2/128
    DNS = 10.66.0.1
    MTU = 1380

    [Peer]
    PublicKey = <base64>
    PresharedKey = <base64>            # optional
    Endpoint = vpn.example.com:51820
    AllowedIPs = 0.0.0.0/0, ::/0
    PersistentKeepalive = 25

Only these keys are understood. wg-quick's hooks (PreUp, PostUp, PreDown,
PostDown) run shell commands as root and have no place in a tool that needs
no root; Table, FwMark, SaveConfig and ListenPort change or depend on the
machine's own routing; they are refused by name with the fix. One [Peer]
only: vpnw's path has one way out.

Keys never appear in a message: errors name the key, never its value, and
WgConf's repr hides them.
"""
from __future__ import annotations

import base64
import ipaddress
import re
from dataclasses import dataclass, field

from stages.config.errors import ConfigError

_INTERFACE_KEYS = {"privatekey", "address", "dns", "mtu"}
_PEER_KEYS = {"publickey", "presharedkey", "endpoint", "allowedips", "persistentkeepalive"}
# Known wg-quick keys vpnw refuses, with why and the fix.
_REFUSED = {
    "preup": "runs a shell command as root", "postup": "runs a shell command as root",
    "predown": "runs a shell command as root", "postdown": "runs a shell command as root",
    "table": "changes the machine's routing tables", "fwmark": "marks the machine's packets",
    "saveconfig": "rewrites the file", "listenport": "binds a port on the machine",
}
_SPELLING = {k.lower(): k for k in ("PrivateKey", "Address", "DNS", "MTU", "PublicKey",
                                    "PresharedKey", "Endpoint", "AllowedIPs",
                                    "PersistentKeepalive")}


@dataclass(frozen=True)
class WgConf:
    source: str
    addresses: tuple                 # ipaddress interfaces (address with prefix)
    dns: tuple                       # ipaddress addresses of the office's DNS servers
    mtu: int | None
    endpoint_host: str
    endpoint_port: int
    allowed_ips: tuple               # ipaddress networks
    keepalive: int                   # seconds, 0: off
    public_key: bytes = field(repr=False)           # 32 bytes
    private_key: bytes | None = field(default=None, repr=False)   # None: from private_key_file/env
    preshared_key: bytes | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        host = f"[{self.endpoint_host}]" if ":" in self.endpoint_host else self.endpoint_host
        return f"{host}:{self.endpoint_port}"


def decode_key(value: str) -> bytes | None:
    """A WireGuard key (base64 of 32 bytes) -> bytes, None when it is not one."""
    value = value.strip()
    if not re.fullmatch(r"[A-Za-z0-9+/]{43}=", value):
        return None
    raw = base64.b64decode(value)
    return raw if len(raw) == 32 else None


def parse_wg_quick(text: str, source: str, *, key_from_elsewhere: bool = False) -> WgConf:
    """The .conf's text -> WgConf; ConfigError naming the file, the line and the fix."""
    def error(line: int | None, problem: str, fix: str) -> ConfigError:
        return ConfigError(problem, fix, file=source, line=line)

    iface, peer = _sections(text, error)
    return WgConf(source=source, **_interface(iface, key_from_elsewhere, error), **_peer(peer, error))


def _sections(text: str, error) -> tuple[dict, dict]:
    """{key: (value, line)} of [Interface] and of [Peer], each checked for known keys."""
    section = None
    sections_seen: list[str] = []
    values: dict[str, dict[str, tuple[str, int]]] = {"interface": {}, "peer": {}}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("["):
            name = line.strip("[]").strip().lower()
            if not line.endswith("]") or name not in ("interface", "peer"):
                raise error(number, f"unknown section {line[:40]!r}",
                            "use only [Interface] and one [Peer]")
            if name in sections_seen:
                raise error(number, f"a second [{name.capitalize()}] section",
                            "vpnw's WireGuard path has one interface and one peer: keep one")
            sections_seen.append(name)
            section = name
            continue
        if "=" not in line:
            raise error(number, "a line that is neither a section nor Key = Value",
                        "write Key = Value, or comment the line out with #")
        key, value = (part.strip() for part in line.split("=", 1))
        lower = key.lower()
        if section is None:
            raise error(number, f"{key[:40]} before any section", "put it under [Interface] or [Peer]")
        if lower in _REFUSED:
            raise error(number, f"{key} is not supported ({_REFUSED[lower]})",
                        f"remove {key}: vpnw needs no root and never changes the machine's network")
        allowed = _INTERFACE_KEYS if section == "interface" else _PEER_KEYS
        if lower not in allowed:
            where = "[Interface]" if section == "interface" else "[Peer]"
            names = ", ".join(_SPELLING[k] for k in sorted(allowed))
            shown = key if re.fullmatch(r"[A-Za-z0-9_-]{1,40}", key) else "?"
            raise error(number, f'unknown key "{shown}" in {where}', f"use only: {names}")
        if lower in values[section]:
            raise error(number, f"{_SPELLING[lower]} is given twice", "keep one (comma-separate lists)")
        values[section][lower] = (value, number)
    if "interface" not in sections_seen:
        raise error(None, "no [Interface] section", "add [Interface] with PrivateKey and Address")
    if "peer" not in sections_seen:
        raise error(None, "no [Peer] section", "add [Peer] with PublicKey, Endpoint and AllowedIPs")
    return values["interface"], values["peer"]


def _items(table: dict, key: str) -> list[str]:
    return [part.strip() for part in table[key][0].split(",") if part.strip()]


def _key(table: dict, key: str, error, problem: str, fix: str) -> bytes:
    value = decode_key(table[key][0])
    if value is None:
        raise error(table[key][1], problem, fix)
    return value


def _interface(iface: dict, key_from_elsewhere: bool, error) -> dict:
    private_key = None
    private_line = iface.get("privatekey", (None, None))[1]
    if "privatekey" in iface:
        if key_from_elsewhere:
            raise error(private_line, "the private key is given twice (PrivateKey here and "
                        "private_key_file/private_key_env in the config)", "keep one of them")
        private_key = _key(iface, "privatekey", error,
                           "PrivateKey is not a WireGuard key (base64 of 32 bytes)",
                           "paste the key your VPN gave you (wg genkey makes one)")
    elif not key_from_elsewhere:
        raise error(None, "[Interface] has no PrivateKey",
                    "add PrivateKey = ..., or private_key_file / private_key_env in the vpnw config")
    if "address" not in iface:
        raise error(None, "[Interface] has no Address", "add Address = 10.0.0.2/32 (your VPN gives it)")
    addresses = []
    for item in _items(iface, "address"):
        try:
            addresses.append(ipaddress.ip_interface(item))
        except ValueError:
            raise error(iface["address"][1], f"Address {item[:50]!r} is not an address",
                        "write e.g. Address = 10.0.0.2/32") from None
    dns = []
    for item in _items(iface, "dns") if "dns" in iface else ():
        try:
            dns.append(ipaddress.ip_address(item))
        except ValueError:
            raise error(iface["dns"][1], f"DNS {item[:50]!r} is not an address (search "
                        "domains are not supported)", "list only server addresses") from None
    mtu = None
    if "mtu" in iface:
        value, number = iface["mtu"]
        if not value.isdigit() or not 1280 <= int(value) <= 9000:
            raise error(number, "MTU must be a number from 1280 to 9000", "write e.g. MTU = 1420")
        mtu = int(value)
    return dict(addresses=tuple(addresses), dns=tuple(dns), mtu=mtu, private_key=private_key)


def _peer(peer: dict, error) -> dict:
    if "publickey" not in peer:
        raise error(None, "[Peer] has no PublicKey", "add the server's PublicKey = ...")
    public_key = _key(peer, "publickey", error, "PublicKey is not a WireGuard key (base64 of 32 bytes)",
                      "paste the server's public key")
    preshared = None
    if "presharedkey" in peer:
        preshared = _key(peer, "presharedkey", error, "PresharedKey is not a WireGuard key "
                         "(base64 of 32 bytes)", "paste the preshared key your VPN gave you")
    host, port = _endpoint(peer, error)
    if "allowedips" not in peer:
        raise error(None, "[Peer] has no AllowedIPs", "add AllowedIPs = 0.0.0.0/0 (or the office's networks)")
    allowed = []
    for item in _items(peer, "allowedips"):
        try:
            allowed.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise error(peer["allowedips"][1], f"AllowedIPs {item[:50]!r} is not a network",
                        "write e.g. AllowedIPs = 0.0.0.0/0, ::/0") from None
    if not allowed:
        raise error(peer["allowedips"][1], "AllowedIPs is empty", "write e.g. AllowedIPs = 0.0.0.0/0")
    keepalive = 0
    if "persistentkeepalive" in peer:
        value, number = peer["persistentkeepalive"]
        if value.lower() == "off":
            value = "0"
        if not value.isdigit() or int(value) > 65535:
            raise error(number, "PersistentKeepalive must be seconds (0-65535) or off",
                        "write e.g. PersistentKeepalive = 25")
        keepalive = int(value)
    return dict(endpoint_host=host, endpoint_port=port, allowed_ips=tuple(allowed),
                keepalive=keepalive, public_key=public_key, preshared_key=preshared)


def _endpoint(peer: dict, error) -> tuple[str, int]:
    if "endpoint" not in peer:
        raise error(None, "[Peer] has no Endpoint", "add Endpoint = host:port")
    value, number = peer["endpoint"]
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([A-Za-z0-9.-]{1,253}):(\d{1,5})", value)
    if not match:
        raise error(number, "Endpoint is not host:port", "write Endpoint = vpn.example.com:51820")
    port = int(match.group(2) or match.group(4))
    if not 0 < port < 65536:
        raise error(number, "Endpoint's port is not 1-65535", "write Endpoint = host:51820")
    return match.group(1) or match.group(3), port

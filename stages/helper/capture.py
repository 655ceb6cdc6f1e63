"""Capture (docs/architecture.md "Capture"): in the sandbox's own network
namespace, a local default route per family (every address is local) and an
nftables table of vpnw's own that redirects every TCP connection not to the
sandbox's loopback to the capture door, and refuses everything else that is
not loopback traffic. Both work as root of the sandbox's user namespace, no
privilege on the machine.

The ruleset is given to Debian's libnftables (the library behind `nft`,
package libnftables1, which `nftables` pulls in) in this process through
`_ctypes` (stages/kernel/foreign.py: no other step of the helper loads the
`ctypes` package, ~3 ms of CPU before Ready):
`nft -f -` would be a process to spawn (about 25 ms here, against about 3 ms
for the library), and a process spawned after unshare(CLONE_NEWPID) would be
the new namespace's PID 1. The seal check reads the whole ruleset back as
JSON and accepts exactly vpnw's table with exactly its rules; the JSON parts
(`ruleset_text`, `expected_ruleset`, `ruleset_problems`) are pure.
"""
from __future__ import annotations

import errno
import os
import socket
import stat

from stages.helper import netlink
from stages.kernel import foreign as c
from stages.kernel import mounts
from stages.kernel import privileges as priv

TABLE = "vpnw"
_NFT_CTX_OUTPUT_JSON = 1 << 4
LIBRARY = "libnftables.so.1"


class CaptureError(Exception):
    """Capture cannot be set up or does not hold; the message says why."""


def ruleset_text(capture_port: int, dns_port: int) -> str:
    """The table, in nft's language. `nat output` redirects before the
    routing decision is used (the address becomes 127.0.0.1 / ::1 and the
    door's port): DNS to any server, UDP or TCP, to the DNS door; every other
    TCP connection to the capture door. `filter output` then sees only
    loopback traffic or something to refuse (UDP to anywhere else, ICMP, raw
    IP), but for the redirected connections' own packets (`ct status dnat`)."""
    dns = "".join(f"    {family} daddr != {loopback} {proto} dport 53 redirect to :{dns_port}\n"
                  for proto in ("udp", "tcp") for family, loopback in _FAMILIES)
    tcp = "".join(f"    meta l4proto tcp {family} daddr != {loopback} redirect to :{capture_port}\n"
                  for family, loopback in _FAMILIES)
    return (f"table inet {TABLE} {{\n"
            "  chain capture {\n"
            "    type nat hook output priority -100; policy accept;\n"
            f"{dns}{tcp}"
            "  }\n"
            "  chain seal {\n"
            "    type filter hook output priority 0; policy accept;\n"
            "    ip daddr 127.0.0.0/8 accept\n"
            "    ip6 daddr ::1 accept\n"
            "    ct status dnat accept\n"
            "    reject\n"
            "  }\n"
            "}\n")


_FAMILIES = (("ip", "127.0.0.0/8"), ("ip6", "::1"))


# -------------------------------------------------------- what nft lists back

_V4_LOOPBACK = {"prefix": {"addr": "127.0.0.0", "len": 8}}


def _l4(proto: str) -> dict:
    return {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": proto}}


def _daddr(family: str, op: str) -> dict:
    right = _V4_LOOPBACK if family == "ip" else "::1"
    return {"match": {"op": op, "left": {"payload": {"protocol": family, "field": "daddr"}},
                      "right": right}}


def _dport(proto: str, port: int) -> dict:
    return {"match": {"op": "==", "left": {"payload": {"protocol": proto, "field": "dport"}},
                      "right": port}}


def expected_ruleset(capture_port: int, dns_port: int) -> list[dict]:
    """What `list ruleset` (JSON, handles left out) must hold: this and nothing else."""
    table = {"family": "inet", "table": TABLE}
    capture = [[_daddr(family, "!="), _dport(proto, 53), {"redirect": {"port": dns_port}}]
               for proto in ("udp", "tcp") for family in ("ip", "ip6")]
    capture += [[_l4("tcp"), _daddr(family, "!="), {"redirect": {"port": capture_port}}]
                for family in ("ip", "ip6")]
    # The redirected connections' own packets: the door's answers leave
    # from 127.0.0.1 to the asked-for address until conntrack undoes the
    # redirect after this hook.
    redirected = {"match": {"op": "in", "left": {"ct": {"key": "status"}}, "right": "dnat"}}
    seal = [[_daddr("ip", "=="), {"accept": None}], [_daddr("ip6", "=="), {"accept": None}],
            [redirected, {"accept": None}],
            [{"reject": {"type": "icmpx", "expr": "port-unreachable"}}]]
    return [
        {"table": {"family": "inet", "name": TABLE}},
        {"chain": {**table, "name": "capture", "type": "nat", "hook": "output", "prio": -100,
                   "policy": "accept"}},
        {"chain": {**table, "name": "seal", "type": "filter", "hook": "output", "prio": 0,
                   "policy": "accept"}},
        *({"rule": {**table, "chain": "capture", "expr": expr}} for expr in capture),
        *({"rule": {**table, "chain": "seal", "expr": expr}} for expr in seal),
    ]


def _without_handles(item: dict) -> dict:
    return {kind: {k: v for k, v in body.items() if k != "handle"} if isinstance(body, dict) else body
            for kind, body in item.items()}


def ruleset_problems(listing: dict, capture_port: int, dns_port: int) -> list[str]:
    """What is wrong with the namespace's whole ruleset (`nft -j list
    ruleset`); [] when it is exactly vpnw's table. Anything unexpected,
    another table included, is a problem."""
    items = listing.get("nftables") if isinstance(listing, dict) else None
    if not isinstance(items, list):
        return ["the nftables ruleset could not be read back as JSON"]
    found = [_without_handles(item) for item in items
             if isinstance(item, dict) and "metainfo" not in item]
    expected = expected_ruleset(capture_port, dns_port)
    if found == expected:
        return []
    extra = [item for item in found if item not in expected]
    missing = [item for item in expected if item not in found]
    problems = [f"unexpected nftables {_describe(item)}" for item in extra[:5]]
    problems += [f"missing nftables {_describe(item)}" for item in missing[:5]]
    return problems or ["the nftables rules are not in the expected order"]


def _describe(item: dict) -> str:
    import json     # only to say what is wrong
    kind, body = next(iter(item.items())) if item else ("item", {})
    if not isinstance(body, dict):
        return f"{kind} {json.dumps(body)[:120]}"
    where = " ".join(str(body[k]) for k in ("family", "table", "chain", "name") if k in body)
    return f"{kind} {where}".rstrip() + (f" {json.dumps(body.get('expr'))[:160]}" if "expr" in body else "")


# ------------------------------------------------------------ the process shell

class Nftables:
    """libnftables in this process (its `nft_ctx`): commands in, text out."""

    def __init__(self):
        try:
            lib = c.Library(LIBRARY)
        except OSError as e:
            raise CaptureError(f"capture needs nftables' library {LIBRARY} (Debian's package "
                               f"nftables, which scripts/setup installs): {e}") from None
        self.ctx_new = lib.function("nft_ctx_new", (c.c_uint,), c.c_void_p)
        self.set_flags = lib.function("nft_ctx_output_set_flags", (c.c_void_p, c.c_uint), None)
        self.run_cmd = lib.function("nft_run_cmd_from_buffer", (c.c_void_p, c.c_char_p))
        self.output = lib.function("nft_ctx_get_output_buffer", (c.c_void_p,), c.c_char_p)
        self.error = lib.function("nft_ctx_get_error_buffer", (c.c_void_p,), c.c_char_p)
        self.ctx_free = lib.function("nft_ctx_free", (c.c_void_p,), None)
        self.lib = lib
        self.ctx = self.ctx_new(0)
        if not self.ctx:
            raise CaptureError("libnftables could not make a context")
        lib.function("nft_ctx_buffer_output", (c.c_void_p,))(self.ctx)
        lib.function("nft_ctx_buffer_error", (c.c_void_p,))(self.ctx)

    def run(self, command: str, as_json: bool = False) -> str:
        self.set_flags(self.ctx, _NFT_CTX_OUTPUT_JSON if as_json else 0)
        rc = self.run_cmd(self.ctx, command.encode())
        out = (self.output(self.ctx) or b"").decode("utf-8", "replace")
        err = (self.error(self.ctx) or b"").decode("utf-8", "replace")
        if rc != 0:
            raise CaptureError(f"nftables refused vpnw's rules: {err.strip() or f'error {rc}'}")
        return out

    def free(self) -> None:
        self.ctx_free(self.ctx)
        self.ctx = None


# The sandbox's resolv.conf: a file shipped with vpnw (package data), bound
# read-only over the machine's. Binding a file that is already there costs
# one mount (~0.15 ms); making it per run on a tmpfs cost a mount and an
# unmount, whose RCU grace period stalled the seal for up to ~15 ms under
# load (a memfd cannot be the source of a bind mount).
RESOLV_CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resolv.conf")


def bind_resolv_conf(path: str = "/etc/resolv.conf", source: str = RESOLV_CONF) -> None:
    """The sandbox's resolv.conf names the DNS door: a read-only bind of
    `source` over the machine's, in the sandbox's own mount namespace. No
    file there: the C library asks 127.0.0.1 anyway. Raises OSError (a
    `source` that is not a regular file too: a bind must never put a
    directory or a device there)."""
    target = os.path.realpath(path)
    if not os.path.isfile(target):
        return
    fd = os.open(source, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{source} is not a regular file")
        priv.mount(f"/proc/self/fd/{fd}", target, None, mounts.MS_BIND)
    finally:
        os.close(fd)
    mounts.read_only(target)


def install(capture_port: int, dns_port: int) -> None:
    """The routes and the table, then the check: raises CaptureError (the
    helper's 122) when either cannot be made or does not read back exactly."""
    try:
        # lo's index by one ioctl, not a dump of every link and route: the
        # seal check dumps them all right after (netlink.seal_problems).
        netlink.add_local_default_routes(socket.if_nametoindex("lo"))
    except (OSError, netlink.NetlinkError) as e:
        raise CaptureError(f"cannot add capture's local default routes: {e}") from None
    nft = Nftables()
    try:
        nft.run(ruleset_text(capture_port, dns_port))
        listing = nft.run("list ruleset", as_json=True)
    finally:
        nft.free()
    try:
        from stages.wire.status import read_json     # the status lines' reader: no json, no re
        parsed = read_json(listing)
    except ValueError:
        parsed = None
    problems = ruleset_problems(parsed, capture_port, dns_port)
    if problems:
        raise CaptureError("the capture rules are not as vpnw set them: " + "; ".join(problems))

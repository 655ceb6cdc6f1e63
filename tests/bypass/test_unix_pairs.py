"""Issue 19: Unix socketpairs inside the sandbox. Stream and seqpacket pairs
are allowed (Codex CLI and Chromium's crashpad need seqpacket ones); datagram
pairs stay refused. Every way to point a pair anywhere but at its own other
end is tried here, through a real `vpnw run` in the test world, as root and
as vpnwtest, in the style of test_ways_out.py.

Why seqpacket is safe and datagram is not, from net/unix/af_unix.c:
- unix_seqpacket_sendmsg() sets msg_namelen to 0 before it hands the
  message to unix_dgram_sendmsg(): a destination given to sendto()/sendmsg()
  is ignored, and the message goes to the pair's other end (TO_PEER below:
  the probe finds it there, so it went nowhere else);
- a seqpacket socket connects with unix_stream_connect(), which answers
  EISCONN for a socket already connected, and a stream or seqpacket socket
  never leaves TCP_ESTABLISHED, not even when its other end closes;
- unix_listen() refuses a socket that is not TCP_CLOSE (EINVAL), so a bound
  pair's end never becomes a listener;
- a datagram socket takes any destination in sendto() and may be re-connected
  at any time (unix_dgram_connect()): the dgram-* ways show, outside, that
  this reaches a datagram socket like journald's by path or by abstract name.

A connect() of a pair's end elsewhere meets the Unix-socket supervisor first
(issue 26, test_unix_origin.py), which refuses a socket bound outside with
EPERM before the kernel would say EISCONN or EPROTOTYPE: either is accepted.

Each way lists the errors it accepts inside and fails on anything else,
success included; the control makes the same attempt in the world as the
same user. For seqpacket and stream pairs the control ends the same way as
inside: the kernel, not the filter, keeps them to themselves. The dgram-*
and `seqpacket-socket-*` controls show the targets are reachable.
"""
from __future__ import annotations

import pytest

from bypass_bench import check_control, errnos, plan_of, way

pytestmark = pytest.mark.world

TO_PEER = {"TO_PEER"}
R = "{received}"
WAYS = [
    # ── seqpacket pairs: allowed, and they stay pairs ────────────────────
    way("seqpacket-pair-sendto-dgram-path", "pair_sendto", "seqpacket", "{dgram_path}", R,
        accept=TO_PEER, control="world", root=TO_PEER, user=TO_PEER),
    way("seqpacket-pair-sendto-dgram-abstract", "pair_sendto", "seqpacket", "@{dgram_abstract}", R,
        accept=TO_PEER, control="world", root=TO_PEER, user=TO_PEER),
    way("seqpacket-pair-sendto-listener-path", "pair_sendto", "seqpacket", "{seqpacket_path}", R,
        accept=TO_PEER, control="world", root=TO_PEER, user=TO_PEER),
    way("seqpacket-pair-sendto-with-flags", "pair_sendto", "seqpacket+flags", "{dgram_path}", R,
        accept=TO_PEER, control="world", root=TO_PEER, user=TO_PEER),
    way("seqpacket-pair-scm-rights-to-dgram-path", "pair_scm_rights", "seqpacket", "{dgram_path}", R,
        accept=TO_PEER, control="world", root=TO_PEER, user=TO_PEER),
    way("seqpacket-passed-end-sendto-dgram-path", "passed_pair_sendto", "seqpacket", "{dgram_path}", R,
        accept=TO_PEER, control="world", root=TO_PEER, user=TO_PEER),
    way("seqpacket-pair-connect-listener-path", "pair_connect_listener", "seqpacket", "{seqpacket_path}",
        accept={"EISCONN", "EPERM"}, control="world", root={"EISCONN"}, user={"EISCONN"}),
    way("seqpacket-pair-connect-after-peer-closed", "pair_connect", "seqpacket", "{seqpacket_path}", R,
        "closed", accept={"EISCONN", "EPERM"}, control="world", root={"EISCONN"}, user={"EISCONN"}),
    way("seqpacket-pair-connect-dgram-path", "pair_connect", "seqpacket", "{dgram_path}", R,
        accept={"EPROTOTYPE", "EPERM"}, control="world", root={"EPROTOTYPE"}, user={"EPROTOTYPE"}),
    way("seqpacket-pair-listen-path", "pair_listen", "seqpacket", "path",
        accept={"EINVAL"}, control="world", root={"EINVAL"}, user={"EINVAL"}),
    way("seqpacket-pair-listen-abstract", "pair_listen", "seqpacket", "abstract",
        accept={"EINVAL"}, control="world", root={"EINVAL"}, user={"EINVAL"}),
    # What the pair must not stand in for: a seqpacket socket of its own.
    way("seqpacket-socket-connect-listener-path", "socket_connect_listener", "seqpacket",
        "{seqpacket_path}", accept={"EPERM"}, control="world"),
    # ── stream pairs (allowed before): the same questions ───────────────
    way("stream-pair-sendto-dgram-path", "pair_sendto", "stream", "{dgram_path}", R,
        accept={"EISCONN", "EPERM"}, control="world", root={"EISCONN"}, user={"EISCONN"}),
    way("stream-pair-connect-listener-path", "pair_connect_listener", "stream", "{unix_path}",
        accept={"EISCONN", "EPERM"}, control="world", root={"EISCONN"}, user={"EISCONN"}),
    way("stream-pair-connect-after-peer-closed", "pair_connect", "stream", "{unix_path}", R, "closed",
        accept={"EISCONN", "EPERM"}, control="world", root={"EISCONN"}, user={"EISCONN"}),
    way("stream-pair-listen-path", "pair_listen", "stream", "path",
        accept={"EINVAL"}, control="world", root={"EINVAL"}, user={"EINVAL"}),
    # ── datagram pairs: refused at birth, because outside they reach out ─
    way("dgram-pair-sendto-dgram-path", "pair_sendto", "dgram", "{dgram_path}", R,
        accept={"EPERM"}, control="world"),
    way("dgram-pair-sendto-dgram-abstract", "pair_sendto", "dgram", "@{dgram_abstract}", R,
        accept={"EPERM"}, control="world"),
    way("dgram-pair-connect-dgram-path", "pair_connect", "dgram", "{dgram_path}", R,
        accept={"EPERM"}, control="world"),
    way("dgram-pair-connect-after-peer-closed", "pair_connect", "dgram", "{dgram_path}", R, "closed",
        accept={"EPERM"}, control="world"),
    way("dgram-pair-scm-rights-to-dgram-path", "pair_scm_rights", "dgram", "{dgram_path}", R,
        accept={"EPERM"}, control="world"),
    way("dgram-pair-with-flags-sendto", "pair_sendto", "dgram+flags", "{dgram_path}", R,
        accept={"EPERM"}, control="world"),
    way("dgram-pair-family-high-bits-sendto", "pair_sendto", "dgram+high", "{dgram_path}", R,
        accept={"EPERM"}, control="world"),
    way("raw-pair-sendto-dgram-path", "pair_sendto", "raw", "{dgram_path}", R,
        accept={"EPERM"}, control="world"),
]
WAY_BY_ID = {w.id: w for w in WAYS}
assert len(WAY_BY_ID) == len(WAYS)

# What programs do with a pair must keep working inside.
WORKS = ["stream", "seqpacket", "seqpacket+flags"]
PLAN = plan_of(WAYS) + [{"id": f"works-{k}", "attempt": "pair_roundtrip", "args": [k]} for k in WORKS]


@pytest.mark.parametrize("way_id", list(WAY_BY_ID))
def test_a_pair_reaches_only_its_other_end(bench, user, way_id):
    w = WAY_BY_ID[way_id]
    results, _events = bench.inside("pairs", user, PLAN)
    res = results[w.id]
    assert not res["ok"], f"a way out: {w.id} worked inside the sandbox: {res}"
    assert errnos(res) <= w.accept, f"{w.id}: expected one of {sorted(w.accept)}, got {res}"
    check_control(bench, user, "pairs", PLAN, w)


@pytest.mark.parametrize("kind", WORKS)
def test_stream_and_seqpacket_pairs_carry_messages_and_descriptors_inside(bench, user, kind):
    results, _events = bench.inside("pairs", user, PLAN)
    res = results[f"works-{kind}"]
    assert res["ok"], res

"""The WireGuard path process's pure parts: what it tells wireguard-go."""
from stages.config.wg_quick import parse_wg_quick
from stages.broker.wireguard.control import tunnel_message
from stages.broker.wireguard.path_process import LISTEN_PORT, uapi_set_lines

PRIVATE = "YIqMZ5pRdm1cq3ogWAt8jTPYcd3Bo3L0NdTmlvDzFUg="   # test-only keys
PUBLIC = "2m6ohp0K7H4IW9s2S6YFJmeT/YTkX7/GY4TF3Taflz4="
CONF = f"""[Interface]
PrivateKey = {PRIVATE}
Address = 10.66.0.2/32
[Peer]
PublicKey = {PUBLIC}
PresharedKey = {PUBLIC}
Endpoint = vpn.example.com:51820
AllowedIPs = 10.66.0.0/24, ::/0
PersistentKeepalive = 25
"""


def test_the_uapi_request_points_the_peer_at_the_relay_and_carries_hex_keys():
    wg = parse_wg_quick(CONF, "office.conf")
    tunnel = tunnel_message(wg, wg.private_key)
    assert tunnel["endpoint"] == "vpn.example.com:51820" and tunnel["keepalive"] == 25
    text = uapi_set_lines(tunnel, 40000, 1)
    assert text.endswith("\n\n") and text.startswith("set=1\n")
    lines = text.strip().split("\n")
    assert f"private_key={wg.private_key.hex()}" in lines
    assert f"public_key={wg.public_key.hex()}" in lines
    assert f"preshared_key={wg.public_key.hex()}" in lines
    assert f"listen_port={LISTEN_PORT}" in lines
    # wireguard-go only ever sees the relay: the real endpoint stays outside.
    assert "endpoint=127.0.0.1:40000" in lines and not any("vpn.example.com" in line for line in lines)
    assert [line for line in lines if line.startswith("allowed_ip=")] == \
        ["allowed_ip=10.66.0.0/24", "allowed_ip=::/0"]
    assert lines[-1] == "persistent_keepalive_interval=1"
    assert PRIVATE not in text

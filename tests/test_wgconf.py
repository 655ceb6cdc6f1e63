"""The WireGuard path's config: the wg-quick file, its keys, its errors (121)."""
import textwrap

import pytest

from stages.config.paths import ConfigError, choose_path, load_config
from stages.config.wg_quick import decode_key, parse_wg_quick

PRIVATE = "YIqMZ5pRdm1cq3ogWAt8jTPYcd3Bo3L0NdTmlvDzFUg="   # test-only key, made with wg genkey
PUBLIC = "2m6ohp0K7H4IW9s2S6YFJmeT/YTkX7/GY4TF3Taflz4="

CONF = f"""\
[Interface]
# the office gave us this
PrivateKey = {PRIVATE}
Address = 10.66.0.2/32, fd66::2/128
DNS = 10.66.0.1
MTU = 1380

[Peer]
PublicKey = {PUBLIC}
Endpoint = 192.0.2.10:51820
AllowedIPs = 10.66.0.0/24, 198.51.100.0/24
PersistentKeepalive = 25
"""


def config(tmp_path, conf=CONF, path_extra="", conf_name="office.conf"):
    (tmp_path / conf_name).write_text(conf)
    toml = tmp_path / "paths.toml"
    toml.write_text(textwrap.dedent(f"""\
        version = 1
        name = "office"

        [paths.office]
        type = "wireguard"
        conf = "{conf_name}"
        """) + path_extra)
    return str(toml)


def test_a_wg_quick_file_is_read_whole():
    wg = parse_wg_quick(CONF, "office.conf")
    assert wg.private_key == decode_key(PRIVATE) and wg.public_key == decode_key(PUBLIC)
    assert [str(a) for a in wg.addresses] == ["10.66.0.2/32", "fd66::2/128"]
    assert [str(a) for a in wg.dns] == ["10.66.0.1"]
    assert wg.mtu == 1380 and wg.keepalive == 25
    assert (wg.endpoint_host, wg.endpoint_port, wg.endpoint) == ("192.0.2.10", 51820, "192.0.2.10:51820")
    assert [str(n) for n in wg.allowed_ips] == ["10.66.0.0/24", "198.51.100.0/24"]
    assert PRIVATE not in repr(wg) and "YIqM" not in repr(wg)


def test_the_path_loads_from_the_config_and_never_shows_the_key(tmp_path):
    cfg = load_config(config(tmp_path), env={})
    path = choose_path(cfg, "office")
    assert path.type == "wireguard" and path.describe() == "office (wireguard 192.0.2.10:51820)"
    assert path.wireguard.private_key == decode_key(PRIVATE)
    for text in (repr(path), str(path), repr(cfg)):
        assert PRIVATE not in text and "YIqM" not in text


@pytest.mark.parametrize("line, problem", [
    ("PostUp = iptables -A FORWARD", "PostUp is not supported (runs a shell command as root)"),
    ("PreDown = rm -rf /", "PreDown is not supported"),
    ("Table = off", "Table is not supported"),
    ("FwMark = 0x1", "FwMark is not supported"),
    ("ListenPort = 51820", "ListenPort is not supported"),
    ("SaveConfig = true", "SaveConfig is not supported"),
    ("Colour = blue", 'unknown key "Colour" in [Interface]'),
])
def test_unsupported_keys_name_the_file_line_and_fix(tmp_path, line, problem):
    conf = CONF.replace("MTU = 1380", "MTU = 1380\n" + line)
    with pytest.raises(ConfigError) as caught:
        load_config(config(tmp_path, conf), env={})
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'office.conf'}:7: ") and problem in message
    assert "; fix: " in message and PRIVATE not in message


@pytest.mark.parametrize("change, line, problem", [
    ((f"PrivateKey = {PRIVATE}", "PrivateKey = c2VjcmV0"), 3, "PrivateKey is not a WireGuard key"),
    ((f"PublicKey = {PUBLIC}", "PublicKey = nope"), 9, "PublicKey is not a WireGuard key"),
    (("Endpoint = 192.0.2.10:51820", "Endpoint = 192.0.2.10"), 10, "Endpoint is not host:port"),
    (("Endpoint = 192.0.2.10:51820", "Endpoint = 192.0.2.10:70000"), 10, "port is not 1-65535"),
    (("AllowedIPs = 10.66.0.0/24, 198.51.100.0/24", "AllowedIPs = 10.66.0.0/33"), 11, "is not a network"),
    (("Address = 10.66.0.2/32, fd66::2/128", "Address = ten"), 4, "is not an address"),
    (("DNS = 10.66.0.1", "DNS = 10.66.0.1, office.internal"), 5, "search domains are not supported"),
    (("MTU = 1380", "MTU = 100"), 6, "MTU must be"),
    (("PersistentKeepalive = 25", "PersistentKeepalive = often"), 12, "PersistentKeepalive must be"),
    (("[Peer]", "[Peer]\n[Peer]"), 9, "a second [Peer]"),
    (("[Peer]", "[Server]"), 8, "unknown section"),
    (("MTU = 1380", "MTU = 1380\nMTU = 1400"), 7, "MTU is given twice"),
    (("PublicKey", "PublicKey"), None, None),
])
def test_bad_values_are_121_with_the_line(tmp_path, change, line, problem):
    conf = CONF.replace(*change)
    if problem is None:
        load_config(config(tmp_path, conf), env={})
        return
    with pytest.raises(ConfigError) as caught:
        load_config(config(tmp_path, conf), env={})
    assert caught.value.line == line and problem in str(caught.value)
    assert PRIVATE not in str(caught.value) and "c2VjcmV0" not in str(caught.value)


@pytest.mark.parametrize("drop, problem", [
    (f"PrivateKey = {PRIVATE}\n", "[Interface] has no PrivateKey"),
    ("Address = 10.66.0.2/32, fd66::2/128\n", "[Interface] has no Address"),
    ("Endpoint = 192.0.2.10:51820\n", "[Peer] has no Endpoint"),
    ("AllowedIPs = 10.66.0.0/24, 198.51.100.0/24\n", "[Peer] has no AllowedIPs"),
])
def test_missing_keys_say_what_to_add(tmp_path, drop, problem):
    with pytest.raises(ConfigError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        load_config(config(tmp_path, CONF.replace(drop, "")), env={})


def test_the_key_from_env_or_file_is_read_only_when_chosen(tmp_path):
    conf = CONF.replace(f"PrivateKey = {PRIVATE}\n", "")
    cfg = load_config(config(tmp_path, conf, 'private_key_env = "OFFICE_WG_KEY"\n'), env={})
    with pytest.raises(ConfigError, match="OFFICE_WG_KEY .private_key_env. is not set"):
        choose_path(cfg, "office")
    cfg = load_config(config(tmp_path, conf, 'private_key_env = "OFFICE_WG_KEY"\n'),
                      env={"OFFICE_WG_KEY": PRIVATE})
    assert choose_path(cfg, "office").wireguard.private_key == decode_key(PRIVATE)
    (tmp_path / "office.key").write_text(PRIVATE + "\n")
    cfg = load_config(config(tmp_path, conf, 'private_key_file = "office.key"\n'), env={})
    assert choose_path(cfg, "office").wireguard.private_key == decode_key(PRIVATE)
    (tmp_path / "office.key").write_text("not a key\n")
    with pytest.raises(ConfigError, match="is not a WireGuard key") as caught:
        choose_path(load_config(config(tmp_path, conf, 'private_key_file = "office.key"\n'),
                                env={}), "office")
    assert "not a key" not in str(caught.value)


def test_a_key_in_both_places_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="the private key is given twice"):
        load_config(config(tmp_path, CONF, 'private_key_env = "OFFICE_WG_KEY"\n'), env={})


def test_config_level_errors(tmp_path):
    with pytest.raises(ConfigError, match='unknown key "url" in \\[paths.office\\]') as caught:
        load_config(config(tmp_path, CONF, 'url = "socks5://x:1"\n'), env={})
    assert caught.value.line == 7
    source = config(tmp_path, CONF)
    (tmp_path / "office.conf").unlink()
    with pytest.raises(ConfigError, match="cannot read the WireGuard conf") as caught:
        load_config(source, env={})
    assert caught.value.line == 6

"""The paths config: loading, validation messages, choosing a path, secrecy."""
import os
import textwrap

import pytest

from stages.config.paths import DIRECT, ConfigError, PathSpec, choose_path, load_config

SECRET = "hunter2-Zq9"


def write(tmp_path, body: str, name: str = "office.toml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def load_error(tmp_path, body: str, env=None) -> ConfigError:
    """The error of loading the config and choosing each of its paths in turn."""
    source = write(tmp_path, body)
    with pytest.raises(ConfigError) as caught:
        config = load_config(source, env={} if env is None else env)
        for name in config.paths:
            choose_path(config, name)
    return caught.value


GOOD = """\
    version = 1
    name = "office"
    default = "office"

    [paths.office]
    type = "proxy"
    url = "socks5h://10.8.0.1:1080"

    [paths.plain]
    type = "proxy"
    url = "socks5://10.8.0.1:1081"

    [paths.web]
    type = "proxy"
    url = "http://proxy.office.example:3128"
    username = "alice"
    password_env = "OFFICE_PW"

    [paths.home]
    type = "direct"
"""


def test_good_config_loads_every_kind(tmp_path):
    config = load_config(write(tmp_path, GOOD), env={"OFFICE_PW": SECRET})
    assert config.name == "office" and config.default == "office"
    office = config.paths["office"]
    assert (office.type, office.scheme, office.host, office.port) == ("proxy", "socks5h", "10.8.0.1", 1080)
    assert office.resolves_at_exit is True
    assert config.paths["plain"].resolves_at_exit is False
    web = choose_path(config, "web")
    assert web.resolves_at_exit is True and web.username == "alice" and web.password == SECRET
    assert config.paths["web"].password is None        # read only when the path is chosen
    assert config.paths["home"].type == "direct"
    assert office.describe() == "office (socks5h://10.8.0.1:1080)"


def test_choose_path_default_via_and_unknown(tmp_path):
    config = load_config(write(tmp_path, GOOD), env={"OFFICE_PW": SECRET})
    assert choose_path(config, None).name == "office"
    assert choose_path(config, "web").name == "web"
    assert choose_path(config, "direct") == DIRECT
    assert choose_path(None, None) == DIRECT
    assert choose_path(None, "direct") == DIRECT
    with pytest.raises(ConfigError) as caught:
        choose_path(config, "nope")
    message = str(caught.value)
    assert "nope" in message and "direct, home, office, plain, web" in message and "fix:" in message
    with pytest.raises(ConfigError, match="no config was given"):
        choose_path(None, "office")


def test_config_without_default_uses_direct(tmp_path):
    config = load_config(write(tmp_path, GOOD.replace('    default = "office"\n', "")),
                         env={"OFFICE_PW": SECRET})
    assert choose_path(config, None) == DIRECT


@pytest.mark.parametrize("url, line_words", [
    ('"socks4://10.8.0.1:1080"', 'unknown proxy scheme "socks4"'),
    ('"ftp://10.8.0.1:21"', 'unknown proxy scheme "ftp"'),
    ('"socks5h://10.8.0.1"', "no port"),
    ('"socks5h://10.8.0.1:0"', "no port"),
    ('"socks5h://10.8.0.1:99999"', "not a valid URL"),
    ('"socks5h://10.8.0.1:port"', "not a valid URL"),
    ('"socks5h://:1080"', "no host"),
    ('"http://10.8.0.1:3128/path"', "path, query or fragment"),
    ('"not a url"', "unknown proxy scheme"),
    ('"https://proxy.example:443"', "https:// proxies"),
])
def test_bad_urls_name_file_line_and_fix(tmp_path, url, line_words):
    error = load_error(tmp_path, f"""\
        version = 1
        name = "office"

        [paths.office]
        type = "proxy"
        url = {url}
    """)
    assert line_words in str(error)
    assert error.line == 6
    assert str(error).startswith(f"{error.file}:6: ")
    assert error.file.endswith("office.toml")
    assert "; fix: " in str(error)


@pytest.mark.parametrize("body, line, words", [
    ('version = 1\nname = "o"\n[paths.office]\ntype = "proxy"\n', 3, "has no url"),
    ('version = 1\nname = "o"\n[paths.office]\ntype = "proxy"\nurl = "socks5h://h:1"\ncolour = "red"\n', 6,
     'unknown key "colour"'),
    ('version = 1\nname = "o"\nmode = "x"\n[paths.office]\ntype = "direct"\n', 3, 'unknown key "mode"'),
    ('version = 2\nname = "o"\n[paths.office]\ntype = "direct"\n', 1, "version must be 1"),
    ('version = 1\n[paths.office]\ntype = "direct"\n', None, "needs a name"),
    ('version = 1\nname = "o"\n', None, "defines no paths"),
    ('version = 1\nname = "o"\n[paths.office]\ntype = "vpn"\n', 4, 'type = "direct", "proxy" or "wireguard"'),
    ('version = 1\nname = "o"\ndefault = "gone"\n[paths.office]\ntype = "direct"\n', 3,
     "default names no path"),
    ('version = 1\nname = "o"\n[paths.direct]\ntype = "proxy"\nurl = "socks5h://h:1"\n', 3,
     "built-in direct path"),
    ('version = 1\nname = "o"\n[paths.office]\ntype = "proxy"\nurl = "socks5h://h:1"\n'
     'password_env = "OFFICE_PW"\nusername = "a"\n', 6, "is not set"),
    ('version = 1\nname = "o"\n[paths.office]\ntype = "proxy"\nurl = "socks5h://h:1"\n'
     'username = "alice"\n', 3, "no password"),
    ('version = 1\nname = "o"\n[paths.office]\ntype = "proxy"\nurl = "socks5h://h:1"\n'
     'password_file = "missing.pass"\nusername = "a"\n', 6, "cannot read password_file"),
    ('version = 1\nname = "o"\n[paths.office]\ntype = "proxy"\nurl = "socks5h://h:1"\n'
     'ca_file = "ca.pem"\n', 6, "ca_file"),
    ('version = 1\nname = "o"\n[paths.office\ntype = "proxy"\n', 3, "not valid TOML"),
])
def test_validation_messages(tmp_path, body, line, words):
    error = load_error(tmp_path, body)
    assert words in str(error)
    assert error.line == line
    assert error.file.endswith("office.toml") and str(error).startswith(error.file)
    assert "; fix: " in str(error)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(str(tmp_path / "absent.toml"))
    assert str(err.value) == f"{tmp_path / 'absent.toml'}: no such file; fix: check the file name"


def test_password_sources_and_secrecy(tmp_path):
    (tmp_path / "office.pass").write_text(SECRET + "\n")
    source = write(tmp_path, """\
        version = 1
        name = "o"
        [paths.fromfile]
        type = "proxy"
        url = "socks5h://10.8.0.1:1080"
        username = "alice"
        password_file = "office.pass"
        [paths.inurl]
        type = "proxy"
        url = "http://bob:hunter2-Zq9@10.8.0.1:3128"
    """)
    config = load_config(source, env={})
    from_file, in_url = choose_path(config, "fromfile"), choose_path(config, "inurl")
    assert from_file.password == SECRET and in_url.password == SECRET and in_url.username == "bob"
    for spec in (from_file, in_url):
        for text in (repr(spec), str(spec), spec.describe(), repr(config), str(config)):
            assert SECRET not in text
            assert "bob" not in spec.describe()


def test_errors_never_quote_a_password(tmp_path):
    # The URL holds the password; every error about that URL must not repeat it.
    for url in (f"socks4://u:{SECRET}@h:1", f"socks5h://u:{SECRET}@h", f"socks5h://u:{SECRET}@h:1/x",
                f"https://u:{SECRET}@h:1"):
        error = load_error(tmp_path, f'version = 1\nname = "o"\n[paths.p]\ntype = "proxy"\nurl = "{url}"\n')
        assert SECRET not in str(error) and SECRET not in repr(error)
    error = load_error(tmp_path, f'version = 1\nname = "o"\n[paths.p]\ntype = "proxy"\n'
                                 f'url = "socks5h://u:{SECRET}@h:1"\npassword_env = "X"\n', env={"X": "y"})
    assert "more than once" in str(error) and SECRET not in str(error)


def test_pathspec_repr_hides_password():
    spec = PathSpec(name="p", type="proxy", scheme="socks5h", host="::1", port=1080,
                    username="alice", password=SECRET, resolves_at_exit=True)
    assert SECRET not in repr(spec) and SECRET not in str(spec)
    assert spec.describe() == "p (socks5h://[::1]:1080)"
    assert DIRECT.describe() == "direct"


def test_environment_is_read_from_the_given_mapping(tmp_path):
    source = write(tmp_path, GOOD)
    os.environ.pop("OFFICE_PW", None)
    with pytest.raises(ConfigError, match="OFFICE_PW"):
        choose_path(load_config(source), "web")
    assert choose_path(load_config(source, env={"OFFICE_PW": "x"}), "web").password == "x"


def test_only_the_chosen_paths_secrets_are_needed(tmp_path):
    source = write(tmp_path, GOOD + """
    [paths.filed]
    type = "proxy"
    url = "socks5h://10.8.0.2:1080"
    username = "carol"
    password_file = "absent.pass"
    """)
    config = load_config(source, env={})            # neither OFFICE_PW nor absent.pass
    assert choose_path(config, "office").password is None
    assert choose_path(config, "home").type == "direct"
    with pytest.raises(ConfigError) as caught:
        choose_path(config, "web")
    assert str(caught.value).endswith("the environment variable OFFICE_PW (password_env) is not set; "
                                      "fix: export OFFICE_PW=... before running vpnw, or use password_file")
    assert caught.value.line == 17
    with pytest.raises(ConfigError) as caught:
        choose_path(config, "filed")
    assert "cannot read password_file " in str(caught.value) and "no such file" in str(caught.value)

"""Paths: how an allowed connection leaves the machine (`--config`, `--via`).

A config file names paths:

    version = 1
    name = "office"
    default = "office"                 # optional; without it the default is "direct"

    [paths.office]
    type = "proxy"
    url = "socks5h://10.8.0.1:1080"   # names are resolved at the exit
    username = "alice"                 # optional
    password_env = "OFFICE_PROXY_PASSWORD"   # or password_file = "office.pass"

`direct` is built in. This module is pure apart from reading the config file and
the password source it names; it never touches the network.

Passwords are kept out of every string this module makes: `PathSpec`'s repr
hides the field, `describe()` never shows credentials, and no `ConfigError`
quotes a URL that held one.
"""
from __future__ import annotations

import os
import re

from stages.startup.records import FrozenRecord, NamedTuple   # not dataclasses, not typing
from stages.config.errors import ConfigError  # noqa: F401  (raised here; callers catch it from here)
from stages.config.inputs import InputProblem, read_text

SCHEMES = ("socks5", "socks5h", "http")
# Schemes where the destination name goes to the exit, which resolves it.
RESOLVES_AT_EXIT = {"socks5": False, "socks5h": True, "http": True, "https": True}

# Patterns as text, compiled (and cached by re) on first use: a run with no
# config or --via never compiles them (docs/architecture.md, "Start-up budget").
_PATH_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z"
_TOP_KEYS = {"version", "name", "default", "paths"}
_PATH_KEYS = {"type", "url", "username", "password_env", "password_file", "ca_file"}
_WIREGUARD_KEYS = {"type", "conf", "private_key_file", "private_key_env"}


class SecretSource(NamedTuple):
    """Where a path's password is, read only when the path is chosen."""
    kind: str                      # "env" | "file"
    name: str                      # the variable, or the file's path
    at: "ConfigError"              # file and line, for the message if it cannot be read


class PathSpec(FrozenRecord):
    """One way out: direct, a proxy or a WireGuard tunnel."""
    _uncompared = ("secret",)
    _unshown = ("password", "secret", "wireguard")
    name: str
    type: str                      # "direct" | "proxy" | "wireguard"
    scheme: str | None = None      # "socks5" | "socks5h" | "http"
    host: str | None = None        # the proxy's own host (name or address)
    port: int | None = None
    username: str | None = None
    password: str | None = None    # never shown (repr)
    resolves_at_exit: bool = False
    secret: SecretSource | None = None
    wireguard: object = None       # wgconf.WgConf for type "wireguard"

    def describe(self) -> str:
        """'office (socks5h://10.8.0.1:1080)', never with credentials."""
        if self.type == "direct":
            return self.name
        return f"{self.name} ({self.exit_text()})"

    def exit_text(self) -> str:
        """'socks5h://10.8.0.1:1080' or 'wireguard 192.0.2.1:51820': where the
        path leads, without its name (for messages that already name it)."""
        if self.type == "wireguard":
            return f"wireguard {self.wireguard.endpoint}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def __str__(self) -> str:
        return self.describe()


DIRECT = PathSpec(name="direct", type="direct")


class Config(FrozenRecord):
    """A paths file: its named paths and its default."""
    _uncompared = ("env",)
    _unshown = ("env",)
    name: str
    paths: dict[str, PathSpec]
    default: str | None
    source: str
    env: object = None             # where password_env is read


class _PathsReader:
    """Helper that builds ConfigErrors pointing at the right line."""

    def __init__(self, source: str, text: str):
        from stages.config.toml_lines import key_lines    # only a paths file needs it: not direct
        self.source = source
        self.lines = key_lines(text)

    def error(self, where: tuple[str, ...], problem: str, fix: str) -> ConfigError:
        from stages.config.toml_lines import line_of    # (as in __init__)
        return ConfigError(problem, fix, file=self.source, line=line_of(self.lines, where))


def _parse_proxy_url(url: str, reader: _PathsReader, where: tuple[str, ...]):
    """-> scheme, host, port, username|None, password|None (percent-decoded)."""
    # Never echo the URL itself: it may hold a password.
    import urllib.parse    # only with a config: not on every run's start-up
    from ipaddress import ip_address    # a run without --config parses no address (test_startup_imports)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise reader.error(where, "the proxy url is not a valid URL (bad host or port)",
                           'write it as scheme://host:port, e.g. "socks5h://10.8.0.1:1080"') from None
    scheme = parts.scheme.lower()
    if scheme == "https":
        raise reader.error(
            where, "https:// proxies (TLS to the proxy) are not supported yet: the relay "
            "moves raw sockets and cannot carry a TLS session to the proxy",
            "use socks5h:// or http:// to the proxy over a link you trust (e.g. the office VPN)")
    if scheme not in SCHEMES:
        shown = scheme if re.fullmatch(r"[a-z0-9+.-]{1,16}", scheme) else "?"
        raise reader.error(where, f'unknown proxy scheme "{shown}"',
                           "use socks5:// (vpnw resolves names), socks5h:// or http:// "
                           "(names resolved at the exit)")
    if not parts.hostname:
        raise reader.error(where, "the proxy url has no host",
                           'write it as scheme://host:port, e.g. "socks5h://10.8.0.1:1080"')
    if port is None or port == 0:
        raise reader.error(where, "the proxy url has no port (or port 0)",
                           f'add the proxy\'s port, e.g. "{scheme}://{parts.hostname}:1080"')
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise reader.error(where, "the proxy url has a path, query or fragment",
                           "keep only scheme://host:port")
    host = parts.hostname
    try:
        host = str(ip_address(host))
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9.-]{1,253}", host):
            raise reader.error(where, "the proxy host is not a valid name or address",
                               "use the proxy's address or DNS name") from None
    username = urllib.parse.unquote(parts.username) if parts.username else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return scheme, host, port, username, password


def _read_path(name: str, table, reader: _PathsReader, env, base_dir: str) -> PathSpec:
    where = ("paths", name)
    if not isinstance(table, dict):
        raise reader.error(where, f'"paths.{name}" must be a table',
                           f"write it as a [paths.{name}] section")
    if not re.match(_PATH_NAME, name):
        raise reader.error(where, f'path name "{name[:64]}" is not allowed',
                           "use letters, digits, '.', '_' or '-' (at most 64)")
    kind = table.get("type")
    if kind == "wireguard" and name != "direct":
        return _read_wireguard_path(name, table, reader, base_dir)
    unknown = sorted(set(table) - _PATH_KEYS)
    if unknown:
        raise reader.error(where + (unknown[0],), f'unknown key "{unknown[0]}" in [paths.{name}]',
                           "use only: " + ", ".join(sorted(_PATH_KEYS)))
    if kind not in ("direct", "proxy"):
        raise reader.error(where + ("type",), f'[paths.{name}] needs type = "direct", "proxy" '
                           'or "wireguard"', 'add type = "proxy" (with a url), type = "wireguard" '
                           '(with a conf) or type = "direct"')
    if name == "direct" and kind != "direct":
        raise reader.error(where, '"direct" is the built-in direct path and cannot be a proxy',
                           "give the proxy path another name")
    if kind == "direct":
        extra = sorted(set(table) - {"type"})
        if extra:
            raise reader.error(where + (extra[0],), f'a direct path takes no "{extra[0]}"',
                               'remove it, or use type = "proxy"')
        return PathSpec(name=name, type="direct")

    url = table.get("url")
    if not isinstance(url, str) or not url:
        raise reader.error(where + ("url",), f"[paths.{name}] is a proxy but has no url",
                           'add url = "socks5h://host:port" (or socks5://, http://)')
    scheme, host, port, username, password = _parse_proxy_url(url, reader, where + ("url",))
    username, secret = _credentials(name, table, reader, base_dir, scheme, username, password)

    if "ca_file" in table:
        raise reader.error(where + ("ca_file",), "ca_file applies only to https:// proxies, "
                           "which are not supported yet", "remove ca_file")
    return PathSpec(name=name, type="proxy", scheme=scheme, host=host, port=port,
                    username=username, password=password,
                    resolves_at_exit=RESOLVES_AT_EXIT[scheme], secret=secret)


def _credentials(name: str, table: dict, reader: _PathsReader, base_dir: str, scheme: str,
                 username: str | None, password: str | None) -> tuple[str | None, SecretSource | None]:
    """A proxy path's username and where its password comes from (the url,
    password_env or password_file: one of them), checked together."""
    where = ("paths", name)
    if "username" in table:
        if not isinstance(table["username"], str) or not table["username"]:
            raise reader.error(where + ("username",), "username must be a non-empty string",
                               'write username = "alice"')
        if username is not None:
            raise reader.error(where + ("username",), "the username is given twice (url and username)",
                               "keep one of them")
        username = table["username"]

    sources = [k for k in ("password_env", "password_file") if k in table]
    if password is not None:
        sources.insert(0, "url")
    if len(sources) > 1:
        raise reader.error(where + (sources[-1],), "the password is given more than once ("
                           + " and ".join(sources) + ")", "keep only one password source")
    # Only the chosen path's secret is read (choose_path): a config may name
    # paths whose passwords this run has no reason to hold.
    secret = None
    if "password_env" in table:
        var = table["password_env"]
        if not isinstance(var, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
            raise reader.error(where + ("password_env",), "password_env must name an environment variable",
                               'write password_env = "OFFICE_PROXY_PASSWORD"')
        secret = SecretSource("env", var, reader.error(where + ("password_env",), "", ""))
    if "password_file" in table:
        file_name = table["password_file"]
        if not isinstance(file_name, str) or not file_name:
            raise reader.error(where + ("password_file",), "password_file must be a file name",
                               'write password_file = "office.pass" (relative to this config)')
        file_path = os.path.join(base_dir, os.path.expanduser(file_name))
        secret = SecretSource("file", file_path, reader.error(where + ("password_file",), "", ""))
    has_password = password is not None or secret is not None
    if has_password and username is None:
        raise reader.error(where, f"[paths.{name}] has a password but no username",
                           'add username = "..." (or put it in the url as user@host)')
    if username is not None and not has_password:
        raise reader.error(where, f"[paths.{name}] has a username but no password",
                           "add password_env or password_file")
    for label, value in (("username", username), ("password", password)):
        _check_credential(label, value, reader.error(where, "", ""))
    if username is not None and ":" in username and scheme == "http":
        raise reader.error(where, "an HTTP proxy username cannot contain ':'",
                           "use another username")
    return username, secret


def _read_wireguard_path(name: str, table, reader: _PathsReader, base_dir: str) -> PathSpec:
    """A [paths.NAME] with type = "wireguard": the wg-quick file it names is
    read and checked now (its errors are 121 with its own file:line); a key
    from private_key_file/_env is read only when the path is chosen."""
    # WgConf is a dataclass: only a wireguard path loads dataclasses (tests/test_startup_imports.py).
    from stages.config.wg_quick import parse_wg_quick
    where = ("paths", name)
    unknown = sorted(set(table) - _WIREGUARD_KEYS)
    if unknown:
        raise reader.error(where + (unknown[0],), f'unknown key "{unknown[0]}" in [paths.{name}]',
                           "a wireguard path takes only: " + ", ".join(sorted(_WIREGUARD_KEYS)))
    conf = table.get("conf")
    if not isinstance(conf, str) or not conf:
        raise reader.error(where + ("conf",), f"[paths.{name}] is a wireguard path but has no conf",
                           'add conf = "office.conf" (the wg-quick file your VPN gave you)')
    sources = [k for k in ("private_key_file", "private_key_env") if k in table]
    if len(sources) > 1:
        raise reader.error(where + (sources[-1],), "the private key is given more than once ("
                           + " and ".join(sources) + ")", "keep only one key source")
    secret = None
    if "private_key_env" in table:
        var = table["private_key_env"]
        if not isinstance(var, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var):
            raise reader.error(where + ("private_key_env",), "private_key_env must name an "
                               "environment variable", 'write private_key_env = "OFFICE_WG_KEY"')
        secret = SecretSource("env", var, reader.error(where + ("private_key_env",), "", ""))
    if "private_key_file" in table:
        file_name = table["private_key_file"]
        if not isinstance(file_name, str) or not file_name:
            raise reader.error(where + ("private_key_file",), "private_key_file must be a file name",
                               'write private_key_file = "office.key" (relative to this config)')
        secret = SecretSource("file", os.path.join(base_dir, os.path.expanduser(file_name)),
                              reader.error(where + ("private_key_file",), "", ""))
    conf_path = os.path.join(base_dir, os.path.expanduser(conf))
    try:
        text = read_text(conf_path, "WireGuard conf", limit=65536)
    except InputProblem as exc:
        at = reader.error(where + ("conf",), "", "")
        raise ConfigError(f"cannot read the WireGuard conf {conf_path} ({exc.problem})",
                          "give the wg-quick file's path, relative to this config",
                          file=at.file, line=at.line) from None
    wg = parse_wg_quick(text, conf_path, key_from_elsewhere=secret is not None)
    return PathSpec(name=name, type="wireguard", wireguard=wg, secret=secret)


def _check_credential(label: str, value: str | None, at: ConfigError) -> None:
    # RFC 1929 carries each in one length byte; HTTP Basic refuses ':' in the user.
    if value is not None and (len(value.encode()) > 255 or "\n" in value or "\r" in value):
        raise ConfigError(f"the {label} is longer than 255 bytes or spans lines",
                          f"use a shorter single-line {label}", file=at.file, line=at.line)


def with_secret(spec: PathSpec, env=os.environ) -> PathSpec:
    """The path with its password read from the source the config names
    (password_env, password_file); ConfigError when it cannot be."""
    source = spec.secret
    if source is None:
        return spec
    at = source.at
    kind = "password" if spec.type != "wireguard" else "private key"
    option = "password" if spec.type != "wireguard" else "private_key"
    if source.kind == "env":
        if source.name not in env:
            raise ConfigError(f"the environment variable {source.name} ({option}_env) is not set",
                              f"export {source.name}=... before running vpnw, or use {option}_file",
                              file=at.file, line=at.line)
        password = env[source.name]
    else:
        try:
            password = read_text(source.name, kind, limit=4096).rstrip("\r\n")
        except InputProblem as exc:
            raise ConfigError(f"cannot read {option}_file {source.name} ({exc.problem})",
                              f"create the file (one line, the {kind}) or fix its name",
                              file=at.file, line=at.line) from None
    if spec.type == "wireguard":
        from stages.config.wg_quick import decode_key    # (as above: a wireguard path only)
        key = decode_key(password)
        if key is None:
            raise ConfigError(f"the private key from {option}_{source.kind} is not a WireGuard "
                              "key (base64 of 32 bytes)", "put the key your VPN gave you there",
                              file=at.file, line=at.line)
        from dataclasses import replace     # WgConf's: the wireguard path loads it anyway
        return spec.replace(wireguard=replace(spec.wireguard, private_key=key), secret=None)
    _check_credential("password", password, at)
    return spec.replace(password=password, secret=None)


_WG_QUICK = r"^\s*\[Interface\]\s*$(?s:.*)^\s*PrivateKey\s*="


def _refuse_wg_quick(path: str, text: str) -> None:
    """A wg-quick .conf given where the paths config goes: say what it is and
    the lines of a paths config that use it."""
    if not re.search(_WG_QUICK, text, re.M):
        return
    conf = os.path.basename(path)
    raise ConfigError("is a WireGuard (wg-quick) file, not a paths config",
                      f"name it in a paths config (a TOML file of its own) and give that to --config:\n"
                      f'    version = 1\n    name = "office"\n    [paths.office]\n'
                      f'    type = "wireguard"\n    conf = "{conf}"    # beside the paths config\n'
                      f"then: vpnw run --config office.toml --via office -- PROGRAM", file=path)


def load_config(path: str, env=os.environ) -> Config:
    """Read and check a paths config; raises ConfigError."""
    try:
        text = read_text(path, "config")
    except InputProblem as exc:
        raise ConfigError(exc.problem, exc.fix, file=path, line=exc.line) from None
    _refuse_wg_quick(path, text)
    import tomllib    # only with a config: not on every run's start-up
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        problem = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise ConfigError(f"not valid TOML ({problem})", "correct the TOML syntax on that line",
                          file=path, line=int(match.group(1)) if match else None) from None
    reader = _PathsReader(path, text)

    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise reader.error((unknown[0],), f'unknown key "{unknown[0]}"',
                           "use only: version, name, default and [paths.NAME] sections")
    if data.get("version") != 1:
        raise reader.error(("version",), "version must be 1", "write version = 1 at the top")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise reader.error(("name",), "the config needs a name", 'add name = "office"')
    tables = data.get("paths", {})
    if not isinstance(tables, dict) or not tables:
        raise reader.error(("paths",), "the config defines no paths",
                           'add a [paths.NAME] section with type = "proxy" and a url')
    base_dir = os.path.dirname(os.path.abspath(path))
    paths = {key: _read_path(key, value, reader, env, base_dir) for key, value in tables.items()}
    default = data.get("default")
    if default is not None:
        if not isinstance(default, str) or (default not in paths and default != "direct"):
            known = ", ".join(sorted(set(paths) | {"direct"}))
            raise reader.error(("default",), f'default names no path defined here (known: {known})',
                               "set default to one of the known paths, or remove it")
    return Config(name=name, paths=paths, default=default, source=path, env=env)


def choose_path(config: Config | None, via: str | None) -> PathSpec:
    """The path for this run: --via, else the config's default, else direct."""
    if via is None:
        via = config.default if config is not None and config.default else "direct"
    if config is not None and via in config.paths:
        return with_secret(config.paths[via], config.env if config.env is not None else os.environ)
    if via == "direct":
        return DIRECT
    known = ", ".join(sorted((set(config.paths) if config else set()) | {"direct"}))
    shown = via if re.match(_PATH_NAME, via) else repr(via[:64])
    if config is None:
        raise ConfigError(f"--via {shown}: no config was given, so the only path is direct",
                          "add --config FILE that defines this path, or use --via direct")
    raise ConfigError(f"--via {shown}: no path of that name (known: {known})",
                      "use one of the known names, or add a [paths." + shown + "] section",
                      file=config.source)


class ConfigFiles(NamedTuple):
    """What a config names beyond itself, for every path in it (not only the
    chosen one): the program never sees a secret of any of them."""
    named: tuple[str, ...] = ()          # files read-only inside (none yet: ca_file, for https://
                                         # proxies, is refused)
    secret_files: tuple[str, ...] = ()   # hidden inside: password_file, private_key_file, .conf
    secret_vars: tuple[str, ...] = ()    # removed from the program's environment


def config_files(config: Config | None) -> ConfigFiles:
    if config is None:
        return ConfigFiles()
    files, variables = [], []
    for spec in config.paths.values():
        if spec.type == "wireguard":
            files.append(spec.wireguard.source)   # its PrivateKey and PresharedKey
        if spec.secret is not None:
            (variables if spec.secret.kind == "env" else files).append(spec.secret.name)
    return ConfigFiles(secret_files=tuple(dict.fromkeys(files)),
                       secret_vars=tuple(dict.fromkeys(variables)))

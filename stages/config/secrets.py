"""Secrets kept outside (docs/secrets.md): what a `[secrets.NAME]` table
means, where each secret's value comes from, and what the program gets in
its place.

    [secrets.openai]
    host = "api.openai.com"            # the door forwards to https://api.openai.com
    env = "OPENAI_API_KEY"             # the program finds a placeholder here
    from = "env:OPENAI_API_KEY"        # or "command:gh auth token", "file:~/.config/openai/key"

The policy file's words are checked in policy.py; this module holds the
known defaults of the usual APIs (their header, the base-URL variables
their SDKs read, the agent's own credential files), the sources read
outside before the program starts (`fetch`), the placeholder, and the
program's environment with the doors' URLs in it (`program_settings`).

The value itself never goes into a message, a record or an environment:
every error here names the secret and its source, never what it read.
"""
from __future__ import annotations

import base64
import os
import time

from stages.startup.records import NamedTuple   # typing's, without importing typing

# The secret doors: one per secret on the sandbox's loopback, from this port
# up (a `localhost:PORT` rule's port, or a door's, is stepped over).
FIRST_PORT = 47801
COMMAND_TIMEOUT = 10.0         # seconds a command: source may take
DEFAULT_CACHE = 55 * 60        # seconds a command's value is used before it runs again
MAX_VALUE = 16 * 1024          # bytes a source may give
DEFAULT_HEADER = "Authorization: Bearer {}"
SOURCE_KINDS = ("env", "command", "file")

# Headers that carry a credential: a program's own (its placeholder, or a
# key it found) never reaches the host; the door adds the real one.
CREDENTIAL_HEADERS = frozenset({b"authorization", b"proxy-authorization", b"x-api-key", b"api-key",
                                b"x-goog-api-key", b"cookie", b"private-token", b"x-auth-token"})


class Known(NamedTuple):
    """What the usual API hosts want, so a policy names only host, env and from."""
    header: str
    base_url_env: tuple = ()       # ((variable, path after the door's URL), ...)
    placeholder: str = ""          # the placeholder's prefix, shaped as the SDK's keys
    hide: tuple = ()               # the agent's own credential files ("~/..."), hidden


KNOWN = {
    "api.openai.com": Known(DEFAULT_HEADER, (("OPENAI_BASE_URL", "/v1"), ("OPENAI_API_BASE", "/v1")),
                            "sk-vpnw-placeholder-", ("~/.codex/auth.json",)),
    "api.anthropic.com": Known("x-api-key: {}", (("ANTHROPIC_BASE_URL", ""),),
                               "sk-ant-vpnw-placeholder-", ("~/.claude/.credentials.json",)),
    "generativelanguage.googleapis.com": Known("x-goog-api-key: {}", (("GOOGLE_GEMINI_BASE_URL", ""),),
                                               "AIzaVpnwPlaceholder", ()),
    "openrouter.ai": Known(DEFAULT_HEADER, (("OPENROUTER_BASE_URL", "/api/v1"),), "sk-or-vpnw-placeholder-"),
    "api.mistral.ai": Known(DEFAULT_HEADER, (("MISTRAL_BASE_URL", ""),), "vpnw-placeholder-"),
    "api.groq.com": Known(DEFAULT_HEADER, (("GROQ_BASE_URL", ""),), "gsk_vpnw_placeholder_"),
    "api.github.com": Known(DEFAULT_HEADER, (), "ghp_vpnwplaceholder", ("~/.config/gh/hosts.yml",)),
    "github.com": Known("Authorization: Basic {basic:x-access-token}", (), "ghp_vpnwplaceholder",
                        ("~/.git-credentials", "~/.netrc")),
}
# The variables the usual SDKs read their key from: learn's suggestion
# (a trace that reached the host, and the variable set).
KEY_VARIABLES = {
    "api.openai.com": "OPENAI_API_KEY",
    "api.anthropic.com": "ANTHROPIC_API_KEY",
    "generativelanguage.googleapis.com": "GEMINI_API_KEY",
    "openrouter.ai": "OPENROUTER_API_KEY",
    "api.mistral.ai": "MISTRAL_API_KEY",
    "api.groq.com": "GROQ_API_KEY",
    "api.github.com": "GH_TOKEN",
}


class Secret(NamedTuple):
    """One `[secrets.NAME]` table, checked (policy.py), defaults filled in."""
    name: str
    host: str                      # the one host the door forwards to
    port: int                      # its port (443 unless the table says host:port)
    env: str | None                # the program's variable that holds the placeholder
    source: str                    # as written: "env:X", "command:...", "file:..."
    header: str                    # "Name: template": {} the value, {basic:USER} Basic of USER:value
    base_url_env: tuple            # ((variable, path), ...)
    allow: tuple | None            # ((METHOD or "*", path, prefix?), ...); None: every request
    cache: int                     # seconds a command's value lasts
    hide: tuple                    # files hidden from the program ("~/..." or absolute)
    line: int | None = None

    @property
    def source_kind(self) -> str:
        return self.source.partition(":")[0]

    @property
    def source_arg(self) -> str:
        return self.source.partition(":")[2]

    @property
    def header_name(self) -> bytes:
        return self.header.partition(":")[0].strip().encode("ascii")

    def says(self) -> str:
        """How a message names it: secret "openai" (from env:OPENAI_API_KEY)."""
        return f'secret "{self.name}" (from {self.source})'


def known(host: str) -> Known | None:
    return KNOWN.get(host)


def door_ports(secrets, taken=()) -> dict[str, int]:
    """name -> the port of its door on the sandbox's loopback."""
    taken = set(taken) | {3128, 1080, 1081, 53}
    ports, port = {}, FIRST_PORT
    for secret in secrets:
        while port in taken:
            port += 1
        ports[secret.name] = port
        taken.add(port)
    return ports


def door_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def placeholder(secret: Secret, token: str) -> str:
    """What the program finds in `env`: worthless anywhere, shaped as the
    SDK's keys (its prefix) so that a client checking the form accepts it."""
    spec = known(secret.host)
    prefix = spec.placeholder if spec and spec.placeholder else "vpnw-placeholder-"
    return f"{prefix}{secret.name}-{token}"


# --- sources: read outside, before the program starts -------------------------

class SourceError(Exception):
    """A source gave no value. str() names the secret and the source, never a value."""


class Fetched:
    """A value and when it was read. Its repr never shows the value: a
    record printed in a message or a traceback says only that it is there."""
    __slots__ = ("value", "at")

    def __init__(self, value: str, at: float):
        self.value = value
        self.at = at                   # time.monotonic() when read

    def __repr__(self) -> str:
        return "Fetched(<value withheld>)"


class Resolved:
    """A run's secrets: the tables, their values (read outside, before the
    program), the doors' ports and the placeholders. Its repr withholds
    the values."""
    __slots__ = ("secrets", "values", "ports", "placeholders", "env")

    def __init__(self, secrets, values: dict, ports: dict, placeholders: dict, env: dict):
        self.secrets, self.values, self.ports = tuple(secrets), values, ports
        self.placeholders, self.env = placeholders, env

    def __repr__(self) -> str:
        return f"Resolved({', '.join(s.name for s in self.secrets)}; values withheld)"

    def record(self) -> list[dict]:
        """run.start's "secrets": what each is and where its door is; the
        source's kind only (a command line may hold anything)."""
        return [{"name": s.name, "host": s.host, "port": s.port, "door": f"127.0.0.1:{self.ports[s.name]}",
                 **({"env": s.env} if s.env else {}), "from": s.source_kind,
                 **({"allow": [f"{m} {p}{'*' if pre else ''}" for m, p, pre in s.allow]}
                    if s.allow is not None else {})}
                for s in self.secrets]


def resolve(secrets, env: dict, *, home: str, taken_ports=(), where: str = "") -> Resolved:
    """Every secret's value read, now, before the program starts; the first
    source that fails is a SourceError (the run does not start)."""
    now = time.monotonic()
    values = {}
    for secret in secrets:
        try:
            values[secret.name] = fetch(secret, env, home=home, now=now)
        except SourceError as exc:
            line = f":{secret.line}" if where and secret.line else ""
            raise SourceError(f"{where}{line}: {exc}" if where else str(exc)) from None
    token = os.urandom(12).hex()
    placeholders = {s.name: placeholder(s, token) for s in secrets}
    return Resolved(secrets, values, door_ports(secrets, taken_ports), placeholders, env)


def fetch(secret: Secret, env: dict, *, home: str, now: float, timeout: float = COMMAND_TIMEOUT) -> Fetched:
    """The secret's value from its source, or SourceError."""
    kind, arg = secret.source_kind, secret.source_arg
    if kind == "env":
        value = env.get(arg, "")
        if not value:
            raise SourceError(f"{secret.says()}: {arg} is not set in vpnw's environment; "
                              f"fix: export {arg} before vpnw, or choose another source")
    elif kind == "file":
        path = expand_home(arg, home)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_VALUE + 1)
        except OSError as exc:
            raise SourceError(f"{secret.says()}: {path} cannot be read ({exc.strerror or 'error'}); "
                              f"fix: put the key in that file, or choose another source") from None
        value = _text(secret, raw)
    else:
        value = _run_command(secret, arg, env, timeout)
    return checked(secret, value, now)


def checked(secret: Secret, value: str, now: float) -> Fetched:
    value = value.strip()
    if not value:
        raise SourceError(f"{secret.says()}: the source gave nothing; fix: make it print the key")
    if len(value) > MAX_VALUE or any(c in value for c in "\r\n\0") or not value.isprintable():
        raise SourceError(f"{secret.says()}: the value holds a line break or a control character, "
                          f"which cannot go into a header; fix: make the source give the key alone")
    return Fetched(value, now)


def _text(secret: Secret, raw: bytes) -> str:
    if len(raw) > MAX_VALUE:
        raise SourceError(f"{secret.says()}: the source gave more than {MAX_VALUE} bytes; "
                          f"fix: make it give the key alone")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SourceError(f"{secret.says()}: the source gave bytes that are not UTF-8; "
                          f"fix: make it give the key as text") from None


def _run_command(secret: Secret, command: str, env: dict, timeout: float) -> str:
    """`sh -c COMMAND`, outside the sandbox, stdin closed; its stderr is the
    user's (vpnw's own), never read into a message (it may echo a key)."""
    import subprocess    # ~4 ms: only a `command:` source runs one, when a run starts
    try:
        done = subprocess.run(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise SourceError(f"{secret.says()}: the command did not finish within {timeout:.0f} s; "
                          f"fix: make it answer without asking, or choose another source") from None
    except OSError as exc:
        raise SourceError(f"{secret.says()}: the command could not start ({exc.strerror}); "
                          f"fix: check the command") from None
    return _command_text(secret, done.returncode, done.stdout)


def _command_text(secret: Secret, returncode: int, out: bytes) -> str:
    if returncode != 0:
        raise SourceError(f"{secret.says()}: the command failed (exit status {returncode}); "
                          f"fix: run it yourself and make it print the key")
    return _text(secret, out)


def from_command(secret: Secret, returncode: int, out: bytes, now: float) -> Fetched:
    """A command's output as the secret's value (the broker's fetch again,
    once its cache time is over), checked as `fetch` checks it."""
    return checked(secret, _command_text(secret, returncode, out), now)


def expand_home(path: str, home: str) -> str:
    if path == "~" or path.startswith("~/"):
        return os.path.join(home, path[2:])
    return path


def header_line(secret: Secret, value: str) -> tuple[bytes, bytes]:
    """(name, value) of the header the door adds."""
    name, _, template = secret.header.partition(":")
    template = template.strip()
    start = template.find("{basic:")
    if start >= 0:
        end = template.index("}", start)
        user = template[start + 7:end]
        token = base64.b64encode(f"{user}:{value}".encode()).decode("ascii")
        text = template[:start] + token + template[end + 1:]
    else:
        text = template.replace("{}", value)
    return name.strip().encode("ascii"), text.encode("utf-8")


# --- method and path rules -----------------------------------------------------

def request_allowed(secret: Secret, method: bytes, path: bytes) -> str | None:
    """None when the secret's allow rules let this request through; else why
    not, as a sentence (the 403's body and the denial's reason)."""
    if secret.allow is None:
        return None
    target = path.split(b"?", 1)[0]
    text = target.decode("ascii", "replace")
    for rule_method, rule_path, prefix in secret.allow:
        if rule_method != "*" and rule_method.encode() != method:
            continue
        if text == rule_path or (prefix and text.startswith(rule_path)):
            return None
    return (f"{method.decode('ascii', 'replace')} {text}: no allow rule of secret "
            f"\"{secret.name}\" matches it (it allows "
            + ", ".join(f"{m} {p}{'*' if pre else ''}" for m, p, pre in secret.allow) + ")")


def unsafe_path(path: bytes) -> str | None:
    """A path a rule could be fooled by: dot segments, an encoded dot or
    slash, a backslash (servers normalise them; rules compare text)."""
    lowered = path.split(b"?", 1)[0].lower()
    if not lowered.startswith(b"/"):
        return "the path does not start with /"
    for bad in (b"%2e", b"%2f", b"%5c", b"\\", b"%00"):
        if bad in lowered:
            return "the path holds an encoded dot, slash or backslash"
    segments = lowered.split(b"/")
    if b"." in segments or b".." in segments:
        return "the path holds a . or .. segment"
    return None


# --- the program's environment ------------------------------------------------

def program_env(env: dict, resolved: Resolved | None) -> dict[str, str]:
    """The caller's environment as the program gets it with these secrets:
    no variable a secret is read from (`from = "env:X"`), none that holds a
    secret's value under another name; each `env` a placeholder, each
    base-URL variable the door's URL, and git told to fetch https://HOST/
    through the door (url.<door>/.insteadOf, in GIT_CONFIG_COUNT's
    variables: nothing written into the user's files)."""
    if not resolved or not resolved.secrets:
        return env
    secrets, ports = resolved.secrets, resolved.ports
    drop = {s.source_arg for s in secrets if s.source_kind == "env"}
    held = [f.value for f in resolved.values.values() if f.value]
    out = {k: v for k, v in env.items() if k not in drop and not any(h in v for h in held)}
    for secret in secrets:
        if secret.env:
            out[secret.env] = resolved.placeholders[secret.name]
        for variable, path in secret.base_url_env:
            out[variable] = door_url(ports[secret.name]) + path
    try:
        count = int(out.get("GIT_CONFIG_COUNT", "0") or "0")
    except ValueError:
        count = 0
    for secret in secrets:
        authority = secret.host if secret.port == 443 else f"{secret.host}:{secret.port}"
        out[f"GIT_CONFIG_KEY_{count}"] = f"url.{door_url(ports[secret.name])}/.insteadOf"
        out[f"GIT_CONFIG_VALUE_{count}"] = f"https://{authority}/"
        count += 1
    out["GIT_CONFIG_COUNT"] = str(count)
    return out

"""The policy file's [secrets.NAME] tables (docs/secrets.md), as words:
each checked for type and form, its problems added to the file's
Problems. The sources are read when a run starts (stages/config/secrets.py's
fetch), never when a policy is only shown."""
from __future__ import annotations

import re

from stages.config import secrets as sc
from stages.config.host_rules import BadRule, parse_rule
from stages.config.policy_problems import Problems, show, string_list, type_name, unknown
from stages.config.policy_tables import check_file_entry

#     [secrets.openai]
#     host = "api.openai.com"
#     env = "OPENAI_API_KEY"
#     from = "env:OPENAI_API_KEY"      # or "command:gh auth token", "file:~/.config/openai/key"

SECRET_KEYS = ("host", "env", "from", "header", "base_url_env", "allow", "cache", "hide")
_SECRET_NAME = r"[a-z0-9][a-z0-9_-]{0,39}"
_ENV_VARIABLE = r"[A-Za-z_][A-Za-z0-9_]*"
_HEADER_NAME = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_PATH_RULE = r"/[!-~]*"
MAX_CACHE = 24 * 3600


def parse_secrets(data: dict, problems: Problems) -> tuple:
    if "secrets" not in data:
        return ()
    body = data["secrets"]
    example = '[secrets.openai] with host, env and from below it'
    if not isinstance(body, dict):
        problems.add(("secrets",), f"secrets is {type_name(body)}, not a table", f"write {example}")
        return ()
    found, envs = [], {}
    for name, table in body.items():
        where = ("secrets", name)
        if not re.fullmatch(_SECRET_NAME, name):
            problems.add(where, f"secret name {show(name)} is not a short lower-case word",
                         'write a name of letters, digits, - and _, as [secrets.openai]')
            continue
        if not isinstance(table, dict):
            problems.add(where, f"secrets.{name} is {type_name(table)}, not a table",
                         f"write [secrets.{name}] on a line of its own, with host, env and from below it")
            continue
        secret = _secret(name, table, where, problems)
        if secret is None:
            continue
        if secret.env and secret.env in envs:
            problems.add(where + ("env",), f'secrets {envs[secret.env]} and {name} both set {secret.env}',
                         "give each secret its own variable")
        if secret.env:
            envs[secret.env] = name
        found.append(secret)
    return tuple(found)


def _secret(name: str, table: dict, where: tuple, problems: Problems):
    before = len(problems.found)
    for key in table:
        if key not in SECRET_KEYS:
            problems.add(where + (key,), f'unknown key "{key}" in [secrets.{name}]', unknown(key, SECRET_KEYS))
    for key in ("host", "from"):
        if key not in table:
            problems.add(where, f"[secrets.{name}] has no {key}",
                         'add host = "api.openai.com"' if key == "host"
                         else 'add from = "env:OPENAI_API_KEY" (or "command:...", "file:...")')
    strings = {}
    for key in ("host", "env", "from", "header"):
        if key in table and not isinstance(table[key], str):
            problems.add(where + (key,), f"{key} is {type_name(table[key])}, not a string",
                         f'write {key} in quotes')
        elif key in table:
            strings[key] = table[key]
    host, port = _secret_host(strings.get("host"), where, problems)
    env = strings.get("env")
    if env is not None and not re.fullmatch(_ENV_VARIABLE, env):
        problems.add(where + ("env",), f"env {show(env)} is not a variable name",
                     'write the variable the program reads its key from, as env = "OPENAI_API_KEY"')
    source = strings.get("from")
    if source is not None:
        kind, sep, arg = source.partition(":")
        if not sep or kind not in sc.SOURCE_KINDS:
            problems.add(where + ("from",), f"from {show(source)} names no source",
                         'write "env:VARIABLE", "command:COMMAND" or "file:PATH"'
                         + (f'; {unknown(kind, sc.SOURCE_KINDS)}' if sep else ""))
        elif not arg.strip() or "\0" in arg:
            problems.add(where + ("from",), f"from {show(source)} is empty after {kind}:",
                         f"write what to read after {kind}:")
        elif kind == "env" and not re.fullmatch(_ENV_VARIABLE, arg):
            problems.add(where + ("from",), f"from {show(source)}: {show(arg)} is not a variable name",
                         'write "env:OPENAI_API_KEY"')
        elif kind == "file" and (bad := check_file_entry(arg)) is not None:
            problems.add(where + ("from",), f"from {show(source)}: {bad[0]}", bad[1])
    spec = sc.known(host) if host else None
    header = strings.get("header", spec.header if spec else sc.DEFAULT_HEADER)
    if "header" in strings:
        hname, colon, template = header.partition(":")
        if not colon or not re.fullmatch(_HEADER_NAME, hname.strip()) or not header.isprintable() \
                or not ("{}" in template or re.search(r"\{basic:[^{}:]+\}", template)):
            problems.add(where + ("header",), f"header {show(header)} is not a header with {{}} for the value",
                         'write header = "Authorization: Bearer {}" (or "x-api-key: {}")')
    base_url_env = _secret_base_urls(table, where, problems, spec)
    allow = _secret_allow(table, where, problems)
    cache = table.get("cache", sc.DEFAULT_CACHE)
    if type(cache) is not int or not 1 <= cache <= MAX_CACHE:
        problems.add(where + ("cache",), f"cache is {show(cache)}, not a number of seconds",
                     f"write cache = 3300 (seconds, 1 to {MAX_CACHE})")
    hide = []
    for index, text, path in string_list(problems, where + ("hide",), table.get("hide", []),
                                          'write hide = ["~/.codex/auth.json"]',
                                          'write each path in quotes') or ():
        bad = check_file_entry(text)
        if bad:
            problems.add(path, f"hide[{index}] {show(text)}: {bad[0]}", bad[1])
        else:
            hide.append(text)
    if len(problems.found) != before:
        return None
    if "hide" not in table:
        hide = list(spec.hide) if spec else []
    if source.startswith("file:"):
        hide.append(source[5:])     # the key's own file: never readable inside
    return sc.Secret(name=name, host=host, port=port, env=env, source=source, header=header,
                     base_url_env=base_url_env, allow=allow, cache=cache, hide=tuple(dict.fromkeys(hide)),
                     line=problems.line_of(where))


def _secret_host(text, where, problems):
    if text is None:
        return None, 443
    try:
        rule = parse_rule(text, None, "allow")
    except BadRule as exc:
        problems.add(where + ("host",), f"host {show(text)}: {exc.problem}", exc.fix)
        return None, 443
    if rule.kind == "wildcard" or rule.kind == "cidr":
        problems.add(where + ("host",), f"host {show(text)} is not one host",
                     'a secret goes to one host: write host = "api.openai.com"')
        return None, 443
    host = rule.host if rule.kind == "name" else str(rule.network.network_address)
    return host, rule.port or 443


def _secret_base_urls(table, where, problems, spec) -> tuple:
    if "base_url_env" not in table:
        return tuple(spec.base_url_env) if spec else ()
    out = []
    for index, text, path in string_list(problems, where + ("base_url_env",), table["base_url_env"],
                                          'write base_url_env = ["OPENAI_BASE_URL"]',
                                          'write each variable in quotes') or ():
        variable, eq, suffix = text.partition("=")
        if not re.fullmatch(_ENV_VARIABLE, variable) or (eq and not re.fullmatch(r"(/[!-~]*)?", suffix)):
            problems.add(path, f"base_url_env[{index}] {show(text)} is not VARIABLE or VARIABLE=/path",
                         'write "OPENAI_BASE_URL", or "MY_BASE_URL=/v1" for a path after the door')
            continue
        if not eq:
            known_path = dict(spec.base_url_env).get(variable, "") if spec else ""
            suffix = known_path
        out.append((variable, suffix))
    return tuple(out)


def _secret_allow(table, where, problems):
    if "allow" not in table:
        return None
    out = []
    for index, text, path in string_list(problems, where + ("allow",), table["allow"],
                                          'write allow = ["POST /v1/chat/completions"]',
                                          'write each rule in quotes, as "GET /v1/models"') or ():
        method, _, rule_path = text.partition(" ")
        if not (method == "*" or re.fullmatch(r"[A-Z]+", method)) or not re.fullmatch(_PATH_RULE, rule_path) \
                or "*" in rule_path[:-1]:
            problems.add(path, f"allow[{index}] {show(text)} is not METHOD /path",
                         'write "POST /v1/chat/completions", "GET /v1/models/*" or "* /v1/*"')
            continue
        prefix = rule_path.endswith("*")
        out.append((method, rule_path[:-1] if prefix else rule_path, prefix))
    return tuple(out)


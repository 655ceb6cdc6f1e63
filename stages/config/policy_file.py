"""A policy file's text -> the fields of its `Policy` (stages/config/policy.py
makes the record), or a PolicyError that names the file, the line and the
fix. This module reads the top keys and the [policy] table; the rule
grammar is host_rules.py's, the other tables policy_tables.py's.

Loaded only when a run names a policy (policy.parse_policy imports it
there): a run without --policy needs neither tomllib, nor the rule
grammar, nor ipaddress before its stages start (docs/architecture.md
"Start-up budget").

tomllib reports no line numbers for values; stages/config/toml_lines.py finds the
line of each key and array item, for the paths config as well.
"""
from __future__ import annotations

import os
import re
import tomllib

from stages.config import policy_tables as tables
from stages.config.errors import PolicyError
from stages.config.host_rules import BadRule, Rule, parse_rule
from stages.config.policy_problems import Problems, show, string_list, type_name, unknown
from stages.config.toml_lines import key_lines
from stages.record.digests import sha256

VERSION = 1
TOP_KEYS = ("version", "name", "policy", "files", "unix", "secrets")
POLICY_KEYS = ("default", "deny_private", "allow", "deny", "ask", "capture")


def _unclosed_array_line(text: str) -> int | None:
    """The line of the `key = [` whose array is still open at the end of the
    text: where a person has to look, rather than the end of the file."""
    opened_at, depth = None, 0
    for number, line in enumerate(text.splitlines(), 1):
        code = re.sub(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'', '""', line).split("#", 1)[0]
        for ch in code:
            if ch == "[" and depth == 0 and "=" in code.split("[", 1)[0]:
                opened_at = number
            if ch == "[" and (depth or "=" in code.split("[", 1)[0]):
                depth += 1
            elif ch == "]" and depth:
                depth -= 1
    return opened_at if depth else None


def policy_fields(text: str, source: str) -> dict:
    """Policy text -> the keyword arguments of its Policy, or PolicyError
    naming source and line."""
    data = _toml(text, source)
    problems = Problems(source, key_lines(text))
    for key in data:
        if key not in TOP_KEYS:
            problems.add((key,), f'unknown key "{key}"', unknown(key, TOP_KEYS))
    _check_version(data, problems)
    name = _name(data, source, problems)
    body = _policy_table(data, problems)
    default = body.get("default")
    if default is not None and default not in ("allow", "deny"):
        shown = show(default) if isinstance(default, str) else type_name(default)
        problems.add(("policy", "default"), f'default is {shown}, not "allow" or "deny"',
                     'write default = "deny" (or "allow")')
        default = None
    flags = {key: _flag(body, key, problems) for key in ("deny_private", "capture", "ask")}
    lists = {which: _rules(body, which, problems) for which in ("allow", "deny")}
    files = tables.parse_files(data, problems)
    unix_allow = tables.parse_unix(data, problems)
    secrets = ()
    if "secrets" in data:
        # Only a policy with [secrets.NAME] reads them: secrets.py (and its
        # base64) stay off the start of a run under any other policy.
        from stages.config.policy_secrets import parse_secrets
        secrets = parse_secrets(data, problems)
    problems.raise_if_any()
    has_allow_list = "allow" in body
    explicit = default is not None
    if default is None:
        default = "deny" if has_allow_list else "allow"
    return dict(name=name, default=default, default_explicit=explicit,
                allow=lists["allow"], deny=lists["deny"], **flags,
                deny_private_line=problems.line_of(("policy", "deny_private")) if flags["deny_private"]
                else None,
                source=source, has_allow_list=has_allow_list, files=files, unix_allow=unix_allow,
                secrets=secrets, sha256=sha256(text.encode("utf-8", "surrogatepass")).hexdigest())


def _toml(text: str, source: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        where = f"{m.group(1)}:{m.group(2)}" if m else "1"
        problem = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", msg)
        if not m and "end of document" in msg:
            where = str(text.count("\n") + 1)
        opened = _unclosed_array_line(text) if "Unclosed array" in msg else None
        if opened:
            where = str(opened)
            problem += " (it opens here and never closes)"
        raise PolicyError(f"{source}:{where}: TOML syntax error: {problem}; fix: correct the "
                          "TOML at that place (strings need quotes, arrays need [ ])",
                          source=source, line=int(where.split(":")[0])) from None


def _check_version(data: dict, problems: Problems) -> None:
    version = data.get("version")
    if "version" not in data:
        problems.add((), "the policy has no version", "add `version = 1` at the top")
    elif type(version) is not int:
        problems.add(("version",), f"version is {type_name(version)}, not an integer",
                     "write `version = 1`")
    elif version != VERSION:
        problems.add(("version",), f"unknown policy version {version}; this vpnw reads version 1",
                     "write `version = 1`, or use the vpnw that wrote this policy")


def _name(data: dict, source: str, problems: Problems) -> str:
    default_name = "stdin" if source == "<stdin>" else os.path.basename(source)
    if default_name.endswith(".toml"):
        default_name = default_name[:-5]
    name = data.get("name", default_name)
    if not isinstance(name, str):
        problems.add(("name",), f"name is {type_name(name)}, not a string", 'write name = "agent"')
        return default_name
    if not name or len(name) > 200 or not name.isprintable():
        problems.add(("name",), "name must be 1 to 200 printable characters", 'write name = "agent"')
    return name


def _policy_table(data: dict, problems: Problems) -> dict:
    body = data.get("policy")
    if "policy" not in data:
        problems.add((), "the policy has no [policy] table",
                     'add a [policy] table with default = "deny" and an allow list')
        return {}
    if not isinstance(body, dict):
        problems.add(("policy",), f"policy is {type_name(body)}, not a table",
                     "write [policy] on a line of its own, with its keys below it")
        return {}
    for key in body:
        if key not in POLICY_KEYS:
            problems.add(("policy", key), f'unknown key "{key}" in [policy]', unknown(key, POLICY_KEYS))
    return body


def _flag(body: dict, key: str, problems: Problems) -> bool:
    """A true/false key of [policy] (false when absent or wrong)."""
    value = body.get(key, False)
    if type(value) is not bool:
        problems.add(("policy", key), f"{key} is {type_name(value)}, not true or false",
                     f"write {key} = true (no quotes)")
        return False
    return value


def _rules(body: dict, which: str, problems: Problems) -> tuple[Rule, ...]:
    rules = []
    for index, pattern, path in string_list(
            problems, ("policy", which), body.get(which, []),
            f'write {which} = ["api.github.com", "*.pythonhosted.org"]',
            'write each pattern in quotes, as "api.github.com"') or ():
        try:
            rules.append(parse_rule(pattern, problems.line_of(path), which))
        except BadRule as exc:
            problems.add(path, f"{which}[{index}] {show(pattern)}: {exc.problem}", exc.fix)
    return tuple(rules)


"""The docs' key tables list every key the parsers accept, and nothing else.

The parsers' own sets are read (every `*_KEYS` constant of stages/config/,
and the variables stages/config/environment.py and the stages read), so a key
added to a parser fails here, naming the key and the table it is missing
from, until the table has a row for it; a row for a key no parser accepts
fails too. A new `*_KEYS` constant that no table is mapped to fails, saying
which: map it in KEY_SETS below (and write its rows)."""
from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import stages.config

ROOT = Path(__file__).resolve().parent.parent
POLICY_MD, CONFIG_MD = "docs/policy.md", "docs/config.md"
EVERY_KEY = "## Every key"
WG_CONF = "### The WireGuard `.conf`"
ENVIRONMENT = "## Environment variables vpnw reads"

# (module, constant) -> (doc, the heading its table is under, the section its
# keys are in: None for the file's top level).
KEY_SETS = {
    ("stages.config.policy_file", "TOP_KEYS"): (POLICY_MD, EVERY_KEY, None),
    ("stages.config.policy_file", "POLICY_KEYS"): (POLICY_MD, EVERY_KEY, "policy"),
    ("stages.config.policy_tables", "FILES_KEYS"): (POLICY_MD, EVERY_KEY, "files"),
    ("stages.config.policy_tables", "UNIX_KEYS"): (POLICY_MD, EVERY_KEY, "unix"),
    ("stages.config.policy_secrets", "SECRET_KEYS"): (POLICY_MD, EVERY_KEY, "secrets.NAME"),
    ("stages.config.paths", "_TOP_KEYS"): (CONFIG_MD, EVERY_KEY, None),
    ("stages.config.paths", "_PATH_KEYS"): (CONFIG_MD, EVERY_KEY, "paths.NAME"),
    ("stages.config.paths", "_WIREGUARD_KEYS"): (CONFIG_MD, EVERY_KEY, "paths.NAME"),
    ("stages.config.wg_quick", "_INTERFACE_KEYS"): (CONFIG_MD, WG_CONF, "Interface"),
    ("stages.config.wg_quick", "_PEER_KEYS"): (CONFIG_MD, WG_CONF, "Peer"),
}


def key_constants() -> dict[tuple[str, str], frozenset[str]]:
    """Every module-level `*_KEYS` set of strings in stages/config/."""
    found = {}
    for info in pkgutil.iter_modules(stages.config.__path__):
        module = importlib.import_module(f"stages.config.{info.name}")
        for name, value in vars(module).items():
            if (name.endswith("_KEYS") and isinstance(value, (tuple, set, frozenset))
                    and value and all(isinstance(v, str) for v in value)):
                found[(module.__name__, name)] = frozenset(value)
    return found


def table_rows(doc: str, heading: str) -> list[list[str]]:
    """The cells of the first table under `heading` in `doc`, header and rule left out."""
    text = (ROOT / doc).read_text()
    at = text.index(f"\n{heading}\n")
    rows = []
    for line in text[at + len(heading) + 2:].splitlines():
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
        elif rows:
            break
    return rows[2:]


def unquote(cell: str) -> str:
    return cell.strip().strip("`")


def documented(doc: str, heading: str) -> list[tuple[str | None, str]]:
    """(section, key) of each row: `[policy] allow` is ("policy", "allow"),
    `version` (None, "version"); a WireGuard row's section is its second cell."""
    out = []
    for cells in table_rows(doc, heading):
        key = unquote(cells[0])
        if heading == WG_CONF:
            out.append((unquote(cells[1]).strip("[]"), key.lower()))
            continue
        found = re.fullmatch(r"\[([^\]]+)\] (\S+)", key)
        out.append((found.group(1), found.group(2)) if found else (None, key))
    return out


def accepted() -> dict[tuple[str, str], set[tuple[str | None, str]]]:
    """(doc, heading) -> the (section, key) pairs the parsers accept there.
    A top-level key that is a table is its rows' section, not a row itself."""
    want: dict[tuple[str, str], set] = {}
    for (module, name), keys in key_constants().items():
        doc, heading, section = KEY_SETS[(module, name)]
        want.setdefault((doc, heading), set()).update((section, key) for key in keys)
    return want


def test_every_key_set_has_a_table():
    unmapped = sorted(set(key_constants()) - set(KEY_SETS))
    assert not unmapped, "\n".join(
        f"{module.replace('.', '/')}.py {name} = {sorted(key_constants()[(module, name)])}: no docs "
        "table is mapped to these keys; map it in KEY_SETS in tests/test_docs_keys.py and give "
        "each key a row in that table" for module, name in unmapped)
    assert not set(KEY_SETS) - set(key_constants()), sorted(set(KEY_SETS) - set(key_constants()))


def missing_and_extra(doc: str, heading: str, want: set) -> tuple[list[str], list[str]]:
    rows = documented(doc, heading)
    sections = {section for section, _key in rows if section is not None}
    have = set(rows)
    shown = lambda section, key: f"`[{section}] {key}`" if section else f"`{key}`"  # noqa: E731
    missing = [shown(s, k) for s, k in sorted(want, key=str)
               if (s, k) not in have
               # a top-level key that is a table: its keys' rows stand for it
               and not (s is None and any(x == k or x.startswith(f"{k}.") for x in sections))]
    extra = [shown(s, k) for s, k in rows if (s, k) not in want]
    return missing, extra


def test_the_docs_tables_list_every_key_the_parsers_accept_and_nothing_else():
    problems = []
    for (doc, heading), want in sorted(accepted().items()):
        missing, extra = missing_and_extra(doc, heading, want)
        for key in missing:
            problems.append(f"{doc} ({heading.lstrip('# ')}): no row for {key}, which the parser accepts")
        for key in extra:
            problems.append(f"{doc} ({heading.lstrip('# ')}): a row for {key}, which no parser accepts")
    assert not problems, "\n".join(problems)


def environment_variables() -> set[str]:
    """What vpnw reads from its environment: stages/config/environment.py's
    checked variables, and every other `VPNW_*` name the stages' code
    holds, but the ones it only sets for the program (client_env)."""
    from stages.config import environment
    names = {value for name, value in vars(environment).items()
             if name.isupper() and isinstance(value, str) and re.fullmatch(r"[A-Z][A-Z0-9_]+", value)}
    for path in (ROOT / "stages").rglob("*.py"):
        names |= set(re.findall(r"(?<![A-Za-z0-9_])VPNW_[A-Z0-9_]+", path.read_text()))
    from stages.config.client_env import program_env
    set_for_the_program, _kept = program_env({}, python=None, run_id="r-0")
    return names - set(set_for_the_program)


def test_the_environment_table_lists_every_variable_vpnw_reads_and_nothing_else():
    have = {unquote(cells[0]) for cells in table_rows(CONFIG_MD, ENVIRONMENT)}
    want = environment_variables()
    problems = [f"{CONFIG_MD} ({ENVIRONMENT.lstrip('# ')}): no row for `{name}`, which vpnw reads"
                for name in sorted(want - have)]
    problems += [f"{CONFIG_MD} ({ENVIRONMENT.lstrip('# ')}): a row for `{name}`, which vpnw does not read"
                 for name in sorted(have - want)]
    assert not problems, "\n".join(problems)


def test_a_key_left_out_is_named_with_its_table():
    """The check itself (whatever the parsers hold today): a key set with
    one key more than the table shows is reported as that key missing from
    that table, and a row no key set has as a row for nothing."""
    want = set(documented(POLICY_MD, EVERY_KEY)) | {("policy", "scope")}
    missing, extra = missing_and_extra(POLICY_MD, EVERY_KEY, want)
    assert (missing, extra) == (["`[policy] scope`"], [])
    missing, extra = missing_and_extra(POLICY_MD, EVERY_KEY, want - {("unix", "allow")})
    assert "`[unix] allow`" in extra

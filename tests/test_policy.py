"""The policy file: a good one loads; a bad one is one PolicyError naming file and line."""
from __future__ import annotations

import json
import re
from ipaddress import ip_network

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stages.config.policy import Policy, PolicyError, load_policy, parse_policy

WHERE = re.compile(r"^agent\.toml:(\d+)(:\d+)?: ")


def bad(text: str) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "agent.toml")
    err = info.value
    for line in str(err).splitlines():
        assert WHERE.match(line) or line.startswith("agent.toml: ..."), line
        assert "fix: " in line or "more problems" in line, line
    return err


def line_of(err: PolicyError) -> int:
    return int(WHERE.match(str(err)).group(1))


GOOD = """\
version = 1
name = "agent"

[policy]
default = "deny"
deny_private = true
allow = ["api.github.com", "*.pythonhosted.org",
         "140.82.112.0/20", "[2001:db8::1]:443", "2001:db8::/32", "files.example:8443"]
deny = ["*.example"]   # a comment
"""


def test_good_policy():
    p = parse_policy(GOOD, "agent.toml")
    assert (p.name, p.default, p.default_explicit, p.deny_private) == ("agent", "deny", True, True)
    assert [r.kind for r in p.allow] == ["name", "wildcard", "cidr", "ip", "cidr", "name"]
    assert [r.line for r in p.allow] == [7, 7, 8, 8, 8, 8]
    assert p.allow[3].port == 443 and p.allow[3].network == ip_network("2001:db8::1/128")
    assert p.allow[5].port == 8443 and p.allow[5].host == "files.example"
    assert p.deny[0].host == "example" and p.deny[0].line == 9
    assert p.source == "agent.toml"


def test_load_policy_reads_a_file(tmp_path):
    f = tmp_path / "agent.toml"
    f.write_text(GOOD)
    assert load_policy(str(f)).allow[0].text == "api.github.com"


def test_load_policy_not_utf8(tmp_path):
    f = tmp_path / "agent.toml"
    f.write_bytes(b'version = 1\n[policy]\nallow = ["\xff"]\n')
    with pytest.raises(PolicyError, match=r"agent\.toml:3: .*UTF-8"):
        load_policy(str(f))


def test_defaults():
    p = parse_policy("version = 1\n[policy]\n", "dir/agent.toml")
    assert (p.name, p.default, p.default_explicit, p.deny_private) == ("agent", "allow", False, False)
    p = parse_policy('version = 1\n[policy]\nallow = ["a.com"]\n')
    assert p.default == "deny" and not p.default_explicit and p.has_allow_list
    p = parse_policy("version = 1\n[policy]\nallow = []\n")
    assert p.default == "deny"
    p = parse_policy('version = 1\n[policy]\ndefault = "allow"\nallow = ["a.com"]\n')
    assert p.default == "allow" and p.default_explicit


def test_allow_all():
    p = Policy.allow_all()
    assert p.default == "allow" and p.no_policy and not p.deny_private and p.source is None


def test_rules_are_canonical():
    p = parse_policy('version = 1\n[policy]\nallow = ["API.GitHub.com.", "*.XN--Bcher-kva.example"]\n')
    assert p.allow[0].host == "api.github.com"
    assert p.allow[1].host == "xn--bcher-kva.example"


# --- hand-made bad policies ------------------------------------------------------------

def test_the_issue_example_message():
    err = bad('version = 1\nname = "agent"\n\n[policy]\ndefault = "deny"\n\n'
              'allow = ["api.github.com", "x.org",\n  "*.*.com"]\n')
    assert str(err).startswith('agent.toml:8: allow[2] "*.*.com": a wildcard may only be "*." '
                               "at the start; fix: ")


@pytest.mark.parametrize("text,line,words", [
    ('version = 1\n[policy]\ncolour = "red"\n', 3, 'unknown key "colour"'),
    ('version = 1\n[policy]\nalow = ["a.com"]\n', 3, 'did you mean "allow"'),
    ('version = 1\npolicyy = 1\n[policy]\n', 2, 'did you mean "policy"'),
    ('version = 1\n[policy]\ndeny_private = "yes"\n', 3, "deny_private is a string"),
    ('version = 1\n[policy]\ndefault = "block"\n', 3, 'default is "block"'),
    ('version = 1\n[policy]\ndefault = 1\n', 3, "default is an integer"),
    ('version = 1\n[policy]\nallow = "a.com"\n', 3, "allow is a string, not an array"),
    ('version = 1\n[policy]\nallow = ["a.com", 7]\n', 3, "allow[1] is an integer"),
    ('version = 1\n[policy]\nallow = ["a.com",\n\n "*"]\n', 5, '"*" alone'),
    ('version = 1\n[policy]\nallow = [""]\n', 3, "empty"),
    ('version = 1\n[policy]\nallow = ["a.com:0"]\n', 3, "not a port"),
    ('version = 1\n[policy]\nallow = ["a.com:65536"]\n', 3, "not a port"),
    ('version = 1\n[policy]\nallow = ["a.com:http"]\n', 3, "not a port"),
    ('version = 1\n[policy]\ndeny = ["10.0.0.1/8"]\n', 3, '"10.0.0.0/8"'),
    ('version = 1\n[policy]\ndeny = ["10.0.0.0/33"]\n', 3, "prefix length"),
    ('version = 1\n[policy]\ndeny = ["10.0.0/8"]\n', 3, "dotted-decimal"),
    ('version = 1\n[policy]\ndeny = ["a.com/8"]\n', 3, "not a CIDR"),
    ('version = 1\n[policy]\ndeny = ["0x7f.1"]\n', 3, "dotted-decimal"),
    ('version = 1\n[policy]\ndeny = ["a b.com"]\n', 3, "spaces"),
    ('version = 1\n[policy]\ndeny = ["*.10.0.0.1"]\n', 3, "not addresses"),
    ('version = 1\n[policy]\ndeny = ["a.*.com"]\n', 3, 'only be "*." at the start'),
    ('version = 1\n[policy]\ndeny = ["[::1"]\n', 3, "without ]"),
    ('version = 1\n[policy]\ndeny = ["[a.com]:80"]\n', 3, "only for IPv6"),
    ('version = 1\n[policy]\ndeny = ["fe80::1%eth0"]\n', 3, "zone id"),
    ('version = 2\n[policy]\n', 1, "unknown policy version 2"),
    ('version = "1"\n[policy]\n', 1, "version is a string"),
    ('version = true\n[policy]\n', 1, "version is a boolean"),
    ('name = "x"\n[policy]\n', 1, "no version"),
    ('version = 1\n', 1, "no [policy] table"),
    ('version = 1\npolicy = 3\n', 2, "policy is an integer"),
    ('version = 1\nname = 3\n[policy]\n', 2, "name is an integer"),
    ('version = 1\n[policy]\n[policy.allow]\nx = 1\n', 3, "allow is a table"),
    ('version = 1\npolicy = {allow = ["*"]}\n', 2, '"*" alone'),
    ('version = 1\npolicy.deny = ["a..b"]\n', 2, "empty label"),
    ('version = 1\n[policy]\n"allow" = [\'x:y:z\']\n', 3, "IPv6"),
    ('version = 1\n[policy]\nallow = """a"""\n', 3, "allow is a string"),
    ('version = 1\n[[policy]]\n', 2, "policy is an array"),
])
def test_bad_policies(text, line, words):
    err = bad(text)
    assert line_of(err) == line, str(err)
    assert words in str(err), str(err)


@pytest.mark.parametrize("text,line", [
    ('version = 1\n[policy\n', 2),
    ('version = 1\n[policy]\nallow = ["a.com"\n', 3),   # where the open array starts
    ('version = 1\n[policy]\nallow = [a.com]\n', 3),
    ('version = 1\n[policy]\ndefault = deny\n', 3),
    ('version = 1\nversion = 1\n', 2),
    ('version = 1\n[policy]\nallow = ["a\x00"]\n', 3),
])
def test_toml_syntax_errors(text, line):
    err = bad(text)
    assert "TOML syntax error" in str(err)
    assert line_of(err) == line
    assert re.match(r"^agent\.toml:\d+(:\d+)?: TOML syntax error: .*; fix: ", str(err))


def test_several_problems_all_reported_in_line_order():
    err = bad('version = 1\n[policy]\ndeny = ["*"]\nallow = ["a..b", "ok.com", "*.*"]\nxx = 1\n')
    lines = str(err).splitlines()
    assert [int(WHERE.match(x).group(1)) for x in lines] == [3, 4, 4, 5]


def test_many_problems_are_capped():
    err = bad("version = 1\n[policy]\nallow = [" + ", ".join(['"*"'] * 50) + "]\n")
    assert "and 30 more problems" in str(err)


# --- hypothesis: right shape, wrong values ------------------------------------------

def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if v == v and v not in (float("inf"), float("-inf")) else "nan"
    if isinstance(v, str):
        return json.dumps(v)          # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


scalar = st.one_of(st.booleans(), st.integers(-5, 70000), st.floats(allow_nan=False),
                   st.text(max_size=12))
patterns = st.one_of(
    st.text(alphabet="ab.*:/[]0123456789-_%x ", max_size=20),
    st.sampled_from(["*", "*.", "*.com", "a.*.com", "10.0.0.1/8", "10.0.0.0/8", "::1", "[::1]:0",
                     "[::1]:443", "a.com:443", "a.com:", ":443", "1.2.3.4.", "0x7f.1", "127.1",
                     "2130706433", "fe80::1%eth0", "a..b", "-a.com", "x" * 70, "[::1", "[a]",
                     "2001:db8::/129", "2001:db8::1/32", "中国.org", "*.中国.org", "a.com:65536"]),
    scalar)
policy_body = st.fixed_dictionaries({}, optional={
    "default": st.one_of(st.sampled_from(["allow", "deny", "Allow", ""]), scalar),
    "deny_private": st.one_of(st.booleans(), scalar),
    "allow": st.one_of(st.lists(patterns, max_size=6), scalar),
    "deny": st.one_of(st.lists(patterns, max_size=6), scalar),
    "extra": scalar,
})
document = st.fixed_dictionaries({}, optional={
    "version": st.one_of(st.just(1), scalar),
    "name": st.one_of(st.text(max_size=10), scalar),
    "policy": st.one_of(policy_body, scalar),
    "other": scalar,
})


def render(doc: dict, multiline: bool) -> str:
    out = []
    for key, value in doc.items():
        if key != "policy" or not isinstance(value, dict):
            out.append(f"{key} = {toml_value(value)}")
    if isinstance(doc.get("policy"), dict):
        out.append("[policy]")
        for key, value in doc["policy"].items():
            if multiline and isinstance(value, list):
                out.append(f"{key} = [\n" + ",\n".join("  " + toml_value(v) for v in value) + "\n]")
            else:
                out.append(f"{key} = {toml_value(value)}")
    return "\n".join(out) + "\n"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document, st.booleans())
def test_generated_policies_load_or_fail_with_file_and_line(doc, multiline):
    text = render(doc, multiline)
    try:
        p = parse_policy(text, "agent.toml")
    except PolicyError as err:
        n_lines = text.count("\n") + 1
        for line in str(err).splitlines():
            m = WHERE.match(line)
            assert m or "more problems" in line, line
            if m:
                assert 1 <= int(m.group(1)) <= n_lines
        return
    assert isinstance(p, Policy)
    assert p.default in ("allow", "deny")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_never_raises_anything_else(text):
    try:
        parse_policy(text, "agent.toml")
    except PolicyError as err:
        assert str(err).startswith("agent.toml:")


def test_a_bad_item_in_a_multiline_array_is_on_its_own_line():
    text = 'version = 1\n[policy]\nallow = [\n  "a.com",\n  # note\n  "b.com",\n  "*",\n]\n'
    assert line_of(bad(text)) == 7


# ── [unix] allow (issue 26) ─────────────────────────────────────────────

UNIX_HEAD = 'version = 1\n[policy]\ndefault = "allow"\n[unix]\n'


def test_unix_allow_takes_paths_and_variables_as_written():
    p = parse_policy(UNIX_HEAD + 'allow = ["$SSH_AUTH_SOCK", "/run/user/1000/bus"]\n')
    assert p.unix_allow == ("$SSH_AUTH_SOCK", "/run/user/1000/bus")
    assert parse_policy('version = 1\n[policy]\ndefault = "allow"\n').unix_allow == ()


@pytest.mark.parametrize("entry,line", [('"relative.sock"', 5), ('"$"', 5), ('"$1X"', 5),
                                        ('"~/agent.sock"', 5), ("7", 5)])
def test_unix_allow_refuses_what_is_neither_a_path_nor_a_variable(entry, line):
    with pytest.raises(PolicyError) as exc:
        parse_policy(UNIX_HEAD + f"allow = [{entry}]\n", source="p.toml")
    assert str(exc.value).startswith(f"p.toml:{line}:") and "fix:" in str(exc.value)


def test_unix_table_knows_only_allow():
    with pytest.raises(PolicyError, match='unknown key "deny" in \\[unix\\]'):
        parse_policy(UNIX_HEAD + 'deny = ["/x"]\n')
    with pytest.raises(PolicyError, match="unix is"):
        parse_policy('version = 1\nunix = 3\n[policy]\ndefault = "allow"\n')


def test_unix_sockets_named_reads_each_variable_once_and_says_what_names_nothing():
    from stages.config.policy import unix_sockets_named
    named, warnings = unix_sockets_named(
        ("$SSH_AUTH_SOCK", "$UNSET", "$RELATIVE", "/run/x.sock"),
        {"SSH_AUTH_SOCK": "/tmp/ssh-1/agent.1", "RELATIVE": "agent.sock"})
    assert named == [("$SSH_AUTH_SOCK", "/tmp/ssh-1/agent.1"), ("/run/x.sock", "/run/x.sock")]
    assert len(warnings) == 2 and "$UNSET" in warnings[0] and "$RELATIVE" in warnings[1]

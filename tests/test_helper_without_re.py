"""The helper reaches Ready without `re` and without the `json` package
(docs/architecture.md, "Start-up budget"): vpnw's launcher no longer loads
`re` before the helper's fork (tests/test_launcher.py), so whatever the
helper needed of it, it would load itself (about 6 ms of its CPU before its
plan). The status lines use `_json`, json's C half, as json.JSONEncoder and
JSONDecoder do for their settings; mountinfo's escapes, git's
core.sshCommand key, the JVM's proxy words and the shell quoting of the ssh
relay are read without a regular expression. Each reads as the regular
expression it replaces (compared here on generated text), and a real run of
root and of vpnwtest, plain and with --capture, shows neither module in the
helper before Ready (control: vpnw itself loads `re` later, and the hook
sees it)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as hs

from e2e_support import audited_run
from startup_support import needs_the_tricks

from progs_support import prog_text
from stages.config import client_env
from stages.kernel import mounts
from stages.wire import status as st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --------------------------------------------------------- each as its regex

OLD_UNESCAPE = re.compile(r"\\([0-7]{3})")
OLD_SSH_COMMAND_KEY = re.compile(r"sshcommand\s*(=|$|[;#])", re.IGNORECASE)
OLD_JVM_WORDS = re.compile(r"proxyHost|proxyPort|proxySet|useSystemProxies", re.IGNORECASE)
OLD_SHELL_PLAIN = re.compile(r"[\w@%+=:,./-]+")

# Text made mostly of the characters these readers look at. re.IGNORECASE
# also takes U+017F (long s) for s, U+212A (Kelvin) for k and U+0130 (dotted
# capital I) for i; the readers take the case str.lower() gives (git and the
# JVM read ASCII case), so those three are left out of the text.
NEAR = hs.text(alphabet=hs.sampled_from(list("\\01234567 89sShHcCoOmMaAnNdDiI=;#\t\n\r\x0b\x0c"
                                              "pPrRxXyYtTeEuUeéß\u00a0\u2003")), max_size=24)
ANY = hs.text(max_size=24)


@settings(max_examples=400, derandomize=True)
@given(hs.one_of(NEAR, ANY))
def test_mountinfos_escapes_are_undone_as_the_regex_did(field):
    assert mounts.unescape(field) == OLD_UNESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


@settings(max_examples=400, derandomize=True)
@given(NEAR)
def test_the_ssh_command_key_is_read_as_the_regex_read_it(tail):
    for rest in (tail, "sshcommand" + tail, "SshCommand" + tail, "sshCOMMAND " + tail):
        rest = rest.strip()      # config_sets_ssh_command hands it stripped
        assert client_env._sets_ssh_command_key(rest) == bool(OLD_SSH_COMMAND_KEY.match(rest)), rest


@settings(max_examples=400, derandomize=True)
@given(NEAR, hs.sampled_from(["", "proxyHost", "PROXYPORT", "proxyset", "useSystemProxies", "proxy"]))
def test_the_jvms_proxy_words_are_found_as_the_regex_found_them(text, word):
    java = text + word + text
    user_chose = "JAVA_TOOL_OPTIONS" in client_env.program_env({"JAVA_TOOL_OPTIONS": java},
                                                               python=None)[1]
    assert user_chose == bool(OLD_JVM_WORDS.search(java)), java


@settings(max_examples=400, derandomize=True)
@given(hs.one_of(NEAR, ANY))
def test_the_shell_quoting_is_plain_exactly_where_the_regex_said(text):
    plain = bool(text) and OLD_SHELL_PLAIN.fullmatch(text) is not None
    assert (client_env._shell_quote(text) == text) == plain, text


ODD_LINES = ['{"a":1}', ' \n{"a": [1, 2.5, "x"]}\r\n', '{"a":NaN}', '{"a":Infinity}', '[1,]',
             '{"a":1} x', '', ' ', '"\\ud800"', '{"a":"\\u00e9\\n"}', '{"a":1e400}', '{"a":-0.0}',
             '{"a":' + "1" * 5000 + '}', '[' * 3000 + ']' * 3000, '{"a":"\x01"}', "{'a':1}",
             '{"a":1,"a":2}', 'true', '\ufeff{}', '{"a":1}\x0c']


def _json_decoders(text):
    try:
        return json.JSONDecoder(parse_constant=st._no_constant).decode(text)
    except (ValueError, RecursionError) as exc:
        return type(exc)


def _ours(text):
    try:
        return st.read_json(text)
    except (ValueError, RecursionError) as exc:
        return type(exc)


@pytest.mark.parametrize("text", ODD_LINES, ids=range(len(ODD_LINES)))
def test_a_line_is_read_as_jsons_decoder_read_it(text):
    ours, theirs = _ours(text), _json_decoders(text)
    if isinstance(theirs, type):       # refused: ours refuses too (a ValueError either way)
        assert isinstance(ours, type) and issubclass(ours, ValueError) == issubclass(theirs, ValueError)
    else:
        assert ours == theirs and repr(ours) == repr(theirs)


@settings(max_examples=300, derandomize=True)
@given(hs.recursive(hs.none() | hs.booleans() | hs.integers() | hs.text() |
                    hs.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(hs.text(), inner, max_size=4),
                    max_leaves=12))
def test_a_value_is_written_as_jsons_encoder_wrote_it(value):
    encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                               check_circular=False)
    try:
        expected = encoder.encode(value)
    except UnicodeEncodeError:
        return
    if isinstance(value, str):          # encode() short-cuts a bare string; st never writes one
        return
    assert "".join(st._ENCODE(value, 0)) == expected
    assert st.read_json(expected) == json.loads(expected)


# ------------------------------------------------- nothing of them on the way

THE_HELPERS_WAY = prog_text("the_helpers_way.py")


@needs_the_tricks
def test_the_helpers_modules_load_neither_re_nor_json(tmp_path):
    out = subprocess.run([sys.executable, "-c", THE_HELPERS_WAY], cwd=tmp_path, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT, "HOME": str(tmp_path)},
                         capture_output=True, text=True).stdout.splitlines()
    before, after = eval(out[-2]), eval(out[-1])      # noqa: S307 - our own printout
    assert {"stages.helper.seal", "stages.wire.status", "_json"} <= set(before)      # control
    assert not {"re", "json"} & set(before)
    assert "re" in after            # control: the policy's parser loads it, and it is seen


@pytest.mark.world
@needs_the_tricks
def test_a_real_helper_reaches_ready_without_re_or_json(world, user):
    """As the launcher starts vpnw (`python -I`, then main), plain and with
    --capture: neither module among vpnw's imports before the helper's fork
    nor the helper's own before Ready. Control: vpnw loads `re` before it
    forks the recorder."""
    work = world.workdir(user)
    for way in ([], ["--capture"]):
        at, imported = audited_run(world, user, work, ["run", *way, "--record", str(work / f"run{len(way)}.jsonl"),
                                                       "--", "true"], tag=str(len(way)))
        forked, vpnw_pid = at[("vpnw", "helper forked")]
        ready, helper_pid = at[("helper", "Ready sent")]
        recorder_forked = at[("vpnw", "recorder forked")][0]
        helpers, vpnws = set(), set()
        for ns, pid, name in imported:
            if (pid == vpnw_pid and ns < forked) or (pid == helper_pid and ns < ready):
                helpers.add(name)
            if pid == vpnw_pid and ns < recorder_forked:
                vpnws.add(name)
        assert {"stages.helper.seal", "stages.wire.status"} <= helpers, way        # control
        assert "re" in vpnws, way                                                   # control
        assert not {"re", "json"} & helpers, (way, sorted({"re", "json"} & helpers))

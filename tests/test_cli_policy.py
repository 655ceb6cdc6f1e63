"""A policy vpnw cannot honour stops the command line before anything starts:
exit 121, a message naming the file (and the line), no traceback, the program
never run and no sandbox or run file made. Through the real `vpnw` console
script in the test world, as root and as an unprivileged user."""
from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from e2e_support import describe

pytestmark = pytest.mark.world

HEAD = 'version = 1\nname = "agent"\n[policy]\n'       # the body starts on line 4

# (id, text or a "@..." stand-in for a file that is not a policy, what the message must hold after "<file>")
BAD_POLICIES = [
    ("unknown-key", HEAD + 'default = "deny"\nallwo = ["api.github.com"]\n',
     ':5: unknown key "allwo" in [policy]; fix: did you mean "allow"?'),
    ("wrong-type", HEAD + 'default = "deny"\ndeny_private = "yes"\n',
     ":5: deny_private is a string, not true or false"),
    ("bad-pattern", HEAD + 'default = "deny"\nallow = ["api.github.com",\n  "a.*.com"]\n',
     ':6: allow[1] "a.*.com": a wildcard may only be "*." at the start'),
    ("unknown-version", 'version = 2\nname = "agent"\n[policy]\n',
     ":1: unknown policy version 2; this vpnw reads version 1"),
    ("toml-syntax", HEAD + 'default = "deny"\nallow = ["api.github.com"\n',
     None),   # the position tomllib reports, checked below
    ("missing-file", "@missing", ": no such file; fix: check the file name"),
    ("directory", "@directory", ": is a directory; fix: name the policy file itself"),
    ("dev-zero", "@/dev/zero", ": is larger than 1024 KiB (or never ends), which no policy file is; "
                               "fix: name the policy file itself"),
    ("byte-order-mark", "\ufeff" + HEAD + 'allow = ["api.github.com"]\n',
     ":1: starts with a UTF-8 byte order mark (BOM), which TOML does not allow; "
     "fix: save it as UTF-8 without a BOM"),
    ("deny-star", HEAD + 'deny = ["*"]\n',
     ':4: deny[0] "*": "*" alone would match every name; fix: to deny everything not allowed, '
     'set default = "deny" and list what is allowed in allow'),
    ("url-as-rule", HEAD + 'allow = ["https://api.github.com/"]\n',
     ':4: allow[0] "https://api.github.com/": this is a URL, not a host pattern; fix: write only '
     'the host'),
    ("ipv6-port-without-brackets", HEAD + 'allow = ["2001:db8::1:443"]\n',
     ':4: allow[0] "2001:db8::1:443": an IPv6 address with a port must be in brackets'),
    ("non-ascii-rule", HEAD + 'deny = ["ｅｖｉｌ.example"]\n',
     ':4: deny[0] "ｅｖｉｌ.example": the pattern holds characters that are not ASCII'),
]


def policy_path(world, text: str) -> str:
    if text == "@missing":
        return str(world.tmp / "files" / "no-such-policy.toml")
    if text == "@directory":     # made here: the test may run before any other made it
        (world.tmp / "files").mkdir(mode=0o755, exist_ok=True)
        return str(world.tmp / "files")
    if text.startswith("@/"):
        return text[1:]
    return write_policy(world, text)


class Attempt:
    """A program that leaves a marker if it ever runs."""

    def __init__(self, world, user):
        self.dir = world.workdir(user)
        self.marker = self.dir / "ran"
        self.argv = ["--", "sh", "-c", f"touch {self.marker}"]

    def never_ran(self) -> bool:
        return not self.marker.exists()


def assert_refused_before_start(r, attempt: Attempt) -> None:
    assert r.returncode == 121, describe(r)
    assert r.stderr.startswith("vpnw: ") or r.stderr.startswith("Usage: "), describe(r)
    assert "Traceback" not in r.stderr, describe(r)
    assert r.stdout == "", describe(r)
    assert attempt.never_ran(), "the program ran"
    # No sandbox, no recorder: nothing was written under the state directory.
    assert list(r.state_home.iterdir()) == [], list(r.state_home.rglob("*"))


def write_policy(world, text: str) -> str:
    return str(world.file(f"bad-{uuid.uuid4().hex[:10]}.toml", text))


@pytest.mark.parametrize("mode", ["guard", "run", "trace"])
@pytest.mark.parametrize("case_id, text, message", BAD_POLICIES, ids=[c[0] for c in BAD_POLICIES])
def test_a_malformed_policy_exits_121_naming_file_and_line(world, user, mode, case_id, text, message):
    path = policy_path(world, text)
    attempt = Attempt(world, user)
    r = world.vpnw([mode, "--policy", path, *attempt.argv], user=user)
    assert_refused_before_start(r, attempt)
    first = r.stderr.splitlines()[0]
    if message is None:
        # An array left open is reported where it opens (line 5), not at the end of the file.
        assert first.startswith(f"vpnw: {path}:5: TOML syntax error: Unclosed array "
                                "(it opens here and never closes); fix: "), describe(r)
    else:
        assert first.startswith(f"vpnw: {path}{message}"), describe(r)


def test_guard_without_a_policy_exits_121(world, user):
    attempt = Attempt(world, user)
    r = world.vpnw(["guard", *attempt.argv], user=user)
    assert_refused_before_start(r, attempt)
    assert "Missing option '--policy'" in r.stderr, describe(r)


# --- a path that resolves names at the exit ---------------------------------------------

OFFICE = 'version = 1\nname = "office"\n\n[paths.office]\ntype = "proxy"\nurl = "socks5h://127.0.0.1:1"\n'
EXIT_REASON = ("deny_private with a default of allow needs the addresses names resolve to, but this path "
               "resolves names at the exit, where vpnw cannot see them; fix: set default = \"deny\" with an "
               "allow list, or use a path that resolves names here (socks5://)")


@pytest.mark.parametrize("body, reason", [
    ('default = "allow"\ndeny_private = true\n', EXIT_REASON),
    ('deny = ["10.0.0.0/8"]\n',
     'deny rule "10.0.0.0/8" (line 4) is an address rule, but this path resolves names at the exit, '
     "where vpnw cannot see the addresses names resolve to, so it would stop only requests written as "
     "addresses; fix: deny by name, or use a path that resolves names here (socks5://)"),
])
def test_a_policy_counting_on_addresses_is_refused_on_a_path_that_resolves_at_the_exit(world, user, body, reason):
    config = str(world.file(f"office-{uuid.uuid4().hex[:8]}.toml", OFFICE))
    policy = write_policy(world, HEAD + body)
    attempt = Attempt(world, user)
    r = world.vpnw(["guard", "--config", config, "--via", "office", "--policy", policy, *attempt.argv], user=user)
    assert_refused_before_start(r, attempt)
    assert r.stderr == f"vpnw: {policy}: {reason}\n", describe(r)


def test_the_same_path_with_a_name_policy_gets_as_far_as_the_path_check(world, user):
    # Control: the refusal above is the policy's, not the path's. With a policy
    # that needs no addresses vpnw goes on, finds the exit down and stops (123),
    # still without running the program.
    config = str(world.file(f"office-{uuid.uuid4().hex[:8]}.toml", OFFICE))
    policy = write_policy(world, HEAD + 'default = "deny"\ndeny_private = true\nallow = ["api.github.com"]\n')
    attempt = Attempt(world, user)
    r = world.vpnw(["guard", "--config", config, "--via", "office", "--policy", policy, *attempt.argv], user=user)
    assert r.returncode == 123, describe(r)
    assert attempt.never_ran()
    assert "Traceback" not in r.stderr


# --- hypothesis: generated bad policies through `vpnw guard` ------------------------------

KNOWN_KEYS = ("default", "deny_private", "allow", "deny")
GOOD_LINES = {"default": 'default = "deny"', "deny_private": "deny_private = true",
              "allow": 'allow = ["api.github.com", "*.pythonhosted.org"]', "deny": 'deny = ["*.example"]'}
label = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
bad_pattern = st.one_of(
    st.builds(lambda a, c, b: f"{a}{c}{b}.com", label, st.sampled_from("@ !?#%&="), label),
    st.builds(lambda a: f"-{a}.com", label),
    st.builds(lambda a: f"{a}-.org", label),
    st.builds(lambda a: f"{a}..{a}", label),
    st.builds(lambda a, b: f"{a}.*.{b}", label, label),
    st.builds(lambda a, p: f"{a}.com:{p}", label, st.one_of(st.just(0), st.integers(65536, 10**6))),
    st.builds(lambda n: f"10.0.0.0/{n}", st.integers(33, 200)),
    st.integers(0, 2**32 - 1).map(str),                            # digits-only names
    st.sampled_from(["*", "", "0x7f.1", "127.1", "[::1]:0"]),
)
wrong_value = {
    "default": st.one_of(st.integers().map(str), st.sampled_from(["true", "false", "[]", '["deny"]'])),
    "deny_private": st.one_of(st.integers().map(str), st.sampled_from(['"yes"', '"true"', "[true]", "1.5"])),
    "allow": st.one_of(st.integers().map(str), st.sampled_from(['"api.github.com"', "true", "[1]", '[["x.com"]]'])),
    "deny": st.one_of(st.integers().map(str), st.sampled_from(['"evil.example"', "false", "[2]"])),
}


@st.composite
def bad_policies(draw):
    """(text, line of the fault): a good policy with exactly one fault."""
    keys = draw(st.permutations(KNOWN_KEYS))
    keys = keys[: draw(st.integers(1, len(keys)))]
    lines = [GOOD_LINES[k] for k in keys]
    fault = draw(st.sampled_from(["unknown-key", "wrong-type", "bad-pattern", "version", "syntax"]))
    if fault == "version":
        version = draw(st.integers(-5, 10**6).filter(lambda v: v != 1))
        return f'version = {version}\nname = "agent"\n[policy]\n' + "\n".join(lines) + "\n", 1
    if fault == "unknown-key":
        key = draw(label.filter(lambda k: k not in KNOWN_KEYS))
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, f"{key} = true")
    elif fault == "wrong-type":
        at = draw(st.integers(0, len(lines) - 1))
        lines[at] = f"{keys[at]} = {draw(wrong_value[keys[at]])}"
    elif fault == "bad-pattern":
        key = draw(st.sampled_from(["allow", "deny"]))
        patterns = [draw(bad_pattern)]
        good = draw(st.lists(st.sampled_from(["api.github.com", "*.example", "10.0.0.0/8", "x.org:443"]),
                             max_size=2))
        patterns[draw(st.integers(0, len(good))):0] = good
        line = f"{key} = [" + ", ".join(f'"{p}"' for p in patterns) + "]"
        if key in keys:
            at = keys.index(key)
            lines[at] = line
        else:
            at = draw(st.integers(0, len(lines)))
            lines.insert(at, line)
    else:
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, draw(st.sampled_from(["deny_private = tru", "= 1", 'name2 = "unterminated',
                                               'allow = ["x",,]', "[policy"])))
    return HEAD + "\n".join(lines) + "\n", 4 + at


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(bad=bad_policies())
def test_generated_bad_policies_never_start_the_program(world, user, bad):
    # 15 examples per user, 30 processes in all: each example is a real vpnw.
    text, line = bad
    path = write_policy(world, text)
    attempt = Attempt(world, user)
    r = world.vpnw(["guard", "--policy", path, *attempt.argv], user=user)
    assert_refused_before_start(r, attempt)
    assert r.stderr.startswith(f"vpnw: {path}:{line}:"), \
        f"{text}\nexpected line {line}\n{describe(r)}"


# --- one error style for every input (issue 13) ------------------------------------------------

def test_a_config_that_is_no_file_reads_like_a_policy_that_is_none(world, user):
    for path, message in ((str(world.tmp / "files"), ": is a directory; fix: name the config file itself"),
                          ("/dev/zero", ": is larger than 1024 KiB (or never ends), which no config file "
                                        "is; fix: name the config file itself")):
        attempt = Attempt(world, user)
        r = world.vpnw(["run", "--config", path, *attempt.argv], user=user)
        assert_refused_before_start(r, attempt)
        assert r.stderr == f"vpnw: {path}{message}\n", describe(r)


def test_an_unreadable_policy(world, user):
    if user == "root":
        pytest.skip("root reads every file; the unprivileged run is the test")
    path = str(world.file(f"secret-{uuid.uuid4().hex[:8]}.toml", HEAD, mode=0o600))
    attempt = Attempt(world, user)
    r = world.vpnw(["guard", "--policy", path, *attempt.argv], user=user)
    assert_refused_before_start(r, attempt)
    assert r.stderr == (f"vpnw: {path}: cannot be read (permission denied); fix: make the file "
                        "readable by the user who runs vpnw\n"), describe(r)


def test_policy_and_config_cannot_both_read_stdin(world, user):
    attempt = Attempt(world, user)
    r = world.vpnw(["guard", "--policy", "-", "--config", "-", *attempt.argv], user=user, input="")
    assert_refused_before_start(r, attempt)
    assert "both read stdin" in r.stderr, describe(r)

"""decide(): the five steps, in order, first decision wins."""
from __future__ import annotations

from ipaddress import ip_address

import pytest

from stages.broker.decide import (
    BadTarget, Decision, LookUp, Target, check_policy_for_path, decide, parse_target,
)
from stages.config.policy import Policy, needs_addresses, parse_policy

A = ip_address


def policy(body: str, source: str = "agent.toml") -> Policy:
    return parse_policy('version = 1\nname = "agent"\n[policy]\n' + body, source)


def t(host: str, port: int = 443) -> Target:
    return parse_target(host, port)


AGENT = policy('default = "deny"\n'                                     # line 4
               "deny_private = true\n"                                  # line 5
               'allow = ["api.github.com", "*.pythonhosted.org"]\n'    # line 6
               'deny = ["*.example"]\n')                                # line 7


# --- the description's own examples ---------------------------------------------

def test_default_deny_reason_set_in_the_policy():
    d = decide(t("evil.example2"), AGENT)
    assert d == Decision(False, "no allow rule matches evil.example2:443; default is deny "
                                "(set in the policy)", "default", ())


def test_default_deny_reason_implied_by_allow_list():
    p = policy('allow = ["api.github.com"]\n')
    d = decide(t("evil.example"), p)
    assert d.reason == ("no allow rule matches evil.example:443; default is deny "
                        "(because the policy has an allow list)")


def test_deny_rule_reason_names_file_and_line():
    d = decide(t("evil.example"), policy('deny = ["x.org", "*.example"]\n'))
    assert not d.allowed
    assert d.reason == 'evil.example:443 matches deny rule "*.example" (agent.toml line 4)'
    assert d.rule == 'deny "*.example" (line 4)'


def test_metadata_address_reason():
    d = decide(t("169.254.169.254", 80), AGENT)
    assert d.reason == ("169.254.169.254: link-local address (169.254.0.0/16), where cloud "
                        "metadata services live; refused by deny_private = true (set in agent.toml)")
    assert d.rule == "deny_private"


@pytest.mark.parametrize("host,addresses,allow,line", [
    ("10.77.0.1", None, '"10.77.0.0/24"', 6),                # an address literal, allowed by CIDR
    ("tracker.office.internal", None, '"*.internal"', 6),    # a special name, refused before any look-up
    ("office.example", ["10.77.0.1"], '"office.example"', 6),  # a name that resolved to a private address
])
def test_a_deny_private_refusal_names_the_setting_and_the_allow_rule_it_overrides(
        host, addresses, allow, line):
    # issue 28: an explicit allow under deny_private = true was overridden silently.
    p = policy(f'default = "deny"\ndeny_private = true\nallow = [{allow}]\n', "office.toml")
    d = decide(t(host, 443), p)
    if addresses is not None:
        assert isinstance(d, LookUp)
        d = decide(t(host, 443), p, [ip_address(a) for a in addresses])
    assert not d.allowed and d.rule == "deny_private", d
    assert d.reason.endswith(f"; refused by deny_private = true (set in office.toml), which comes before "
                             f"allow rule {allow} (office.toml line {line}): set deny_private = false "
                             "to allow it"), d.reason


# --- order of the steps ------------------------------------------------------------

def test_step1_name_deny_beats_allow_and_is_never_looked_up():
    p = policy('allow = ["*.example"]\ndeny = ["bad.example"]\ndeny_private = true\n')
    d = decide(t("bad.example"), p)
    assert isinstance(d, Decision) and not d.allowed and d.rule.startswith('deny "bad.example"')


def test_step2_address_deny_beats_deny_private_and_allow():
    p = policy('allow = ["api.github.com"]\ndeny = ["10.0.0.0/8"]\ndeny_private = true\n')
    assert decide(t("api.github.com"), p) == LookUp()
    d = decide(t("api.github.com"), p, [A("10.1.2.3")])
    assert not d.allowed and d.rule == 'deny "10.0.0.0/8" (line 5)'
    assert "resolved to 10.1.2.3" in d.reason


def test_step3_deny_private_beats_allow():
    d = decide(t("api.github.com"), AGENT, [A("127.0.0.1")])
    assert not d.allowed and d.rule == "deny_private"
    assert d.reason.startswith("api.github.com resolved to 127.0.0.1: loopback address")


def test_step4_allow():
    d = decide(t("api.github.com"), AGENT, [A("140.82.112.6")])
    assert d.allowed and d.rule == 'allow "api.github.com" (line 6)'
    assert d.addresses == (A("140.82.112.6"),)


def test_step5_default_allow_without_allow_list():
    p = policy('deny = ["*.example"]\n')
    d = decide(t("anything.org"), p)
    assert d.allowed and d.rule == "default" and d.addresses == ()
    assert "default is allow (because the policy has no allow list)" in d.reason


def test_ip_literal_goes_through_every_step_without_lookup():
    p = policy('default = "allow"\ndeny_private = true\ndeny = ["8.8.4.0/24"]\n')
    assert decide(t("8.8.4.4"), p).rule == 'deny "8.8.4.0/24" (line 6)'
    assert decide(t("10.0.0.1"), p).rule == "deny_private"
    d = decide(t("8.8.8.8"), p)
    assert d.allowed and d.addresses == (A("8.8.8.8"),)
    assert decide(t("[2606:4700::1111]"), p).addresses == (A("2606:4700::1111"),)


# --- when a look-up is asked for ------------------------------------------------------

def test_no_lookup_for_unmatched_name_under_default_deny():
    assert decide(t("exfil-data.attacker.example2"), AGENT) != LookUp()


def test_no_lookup_when_nothing_depends_on_addresses():
    p = policy('allow = ["api.github.com"]\n')
    d = decide(t("api.github.com"), p)
    assert d.allowed and d.addresses == ()


def test_lookup_when_deny_private_could_refuse():
    assert decide(t("api.github.com"), AGENT) == LookUp()
    assert decide(t("files.pythonhosted.org"), AGENT) == LookUp()


def test_lookup_when_default_allow_and_deny_private():
    p = policy('default = "allow"\ndeny_private = true\n')
    assert decide(t("anything.org"), p) == LookUp()


def test_address_allow_rules_never_make_a_name_looked_up():
    # Issue 13: under a default of deny, an address allow rule applies to
    # address literals only; a name no name rule allows is never looked up.
    p = policy('allow = ["api.github.com", "140.82.112.0/20"]\n')
    verdict = decide(t("c2VjcmV0LXRva2Vu.attacker.net"), p)
    assert verdict == Decision(False, "no allow rule matches c2vjcmv0lxrva2vu.attacker.net:443; "
                               "default is deny (because the policy has an allow list)", "default")
    assert decide(t("github.com"), p).rule == "default"
    # even when the name resolved (a caller that looked it up anyway), its addresses do not allow it
    assert not decide(t("github.com"), p, [A("140.82.112.3")]).allowed
    assert decide(t("140.82.112.3"), p).allowed
    assert decide(t("api.github.com"), p).allowed
    dp = policy('allow = ["api.github.com", "140.82.112.0/20"]\ndeny_private = true\n')
    assert decide(t("api.github.com"), dp) == LookUp()
    assert decide(t("github.com"), dp).rule == "default"


def test_address_rule_for_another_port_does_not_cause_lookup():
    p = policy('allow = ["api.github.com"]\ndeny = ["10.0.0.0/8:22"]\n')
    assert decide(t("api.github.com", 443), p).allowed
    assert decide(t("api.github.com", 22), p) == LookUp()


def test_every_address_must_pass():
    public = [A("140.82.112.6"), A("140.82.112.7"), A("2606:4700::1111")]
    d = decide(t("api.github.com"), AGENT, public + [A("192.168.1.1")])
    assert not d.allowed and "192.168.1.1" in d.reason
    assert d.addresses == tuple(public) + (A("192.168.1.1"),)   # what --dry-run would dial
    d = decide(t("api.github.com"), AGENT, public)
    assert d.allowed and d.addresses == tuple(public)


def test_mapped_private_among_public_is_refused():
    d = decide(t("api.github.com"), AGENT, [A("140.82.112.6"), A("::ffff:169.254.169.254")])
    assert not d.allowed and "169.254.169.254" in d.reason


def test_local_interface_address_refused():
    d = decide(t("api.github.com"), AGENT, [A("140.82.112.6")],
               local_addresses=frozenset({A("140.82.112.6")}))
    assert not d.allowed and "this machine" in d.reason


def test_no_address_is_a_denial():
    d = decide(t("api.github.com"), AGENT, [])
    assert not d.allowed and d.rule == "target"


def test_duplicate_addresses_collapse():
    d = decide(t("api.github.com"), AGENT, [A("140.82.112.6"), "140.82.112.6"])
    assert d.addresses == (A("140.82.112.6"),)


# --- names --------------------------------------------------------------------------

def test_wildcard_does_not_match_apex():
    assert decide(t("pythonhosted.org"), AGENT).rule == "default"
    assert decide(t("a.b.files.pythonhosted.org"), AGENT) == LookUp()


def test_wildcard_does_not_match_lookalike_suffix():
    assert decide(t("evilpythonhosted.org"), AGENT).rule == "default"


@pytest.mark.parametrize("spelling", ["API.GITHUB.COM", "api.github.com.", "Api.GitHub.Com."])
def test_case_and_trailing_dot(spelling):
    p = policy('allow = ["api.github.com"]\n')
    assert decide(t(spelling), p).allowed


def test_names_are_judged_in_their_a_label_form():
    p = policy('allow = ["xn--bcher-kva.example"]\ndeny = ["*.xn--fiqs8s.org"]\n')
    assert decide(t("xn--bcher-kva.example"), p).allowed
    assert decide(t("XN--BCHER-KVA.example"), p).allowed
    assert not decide(t("a.xn--fiqs8s.org"), p).allowed
    for unicode in ("bücher.example", "BÜCHER.example", "a.中国.org"):
        with pytest.raises(BadTarget, match="not ASCII"):
            parse_target(unicode, 443)


@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "127.1", "fe80::1%eth0", "a b", ""])
def test_bad_targets_are_refused_before_decide(host):
    with pytest.raises(BadTarget):
        parse_target(host, 443)


@pytest.mark.parametrize("port", [0, 65536, -1, "443", True])
def test_bad_ports(port):
    with pytest.raises(BadTarget):
        parse_target("example.com", port)


def test_target_text():
    assert str(t("[2001:db8::1]")) == "[2001:db8::1]:443"
    assert str(t("Example.COM.")) == "example.com:443"


# --- ports in rules -----------------------------------------------------------------

def test_port_in_name_rule():
    p = policy('allow = ["api.github.com:443"]\n')
    assert decide(t("api.github.com", 443), p).allowed
    assert not decide(t("api.github.com", 22), p).allowed


def test_port_in_wildcard_and_ipv6_rules():
    p = policy('allow = ["*.example.org:8443", "[2001:db8::1]:443", "10.0.0.0/8:5432"]\n')
    assert decide(t("x.example.org", 8443), p).allowed
    # on 443 only the address literal [2001:db8::1] is allowed: the name is never looked up
    assert decide(t("x.example.org", 443), p).rule == "default"
    assert not decide(t("x.example.org", 80), p).allowed          # nothing can allow port 80
    assert decide(t("[2001:db8::1]", 443), p).allowed
    assert not decide(t("[2001:db8::1]", 80), p).allowed
    assert decide(t("10.9.9.9", 5432), p).allowed
    assert not decide(t("10.9.9.9", 5433), p).allowed


def test_deny_rule_on_one_port_leaves_others():
    p = policy('deny = ["*.example:25"]\n')
    assert not decide(t("mail.example", 25), p).allowed
    assert decide(t("mail.example", 443), p).allowed


def test_address_rule_sees_through_mapped_form():
    p = policy('default = "allow"\ndeny = ["10.0.0.0/8"]\n')
    assert not decide(t("[::ffff:10.1.1.1]"), p).allowed


# --- no policy, exit-resolving paths -----------------------------------------------

def test_no_policy_allows_without_lookup():
    d = decide(t("anything.example"), Policy.allow_all())
    assert d.allowed and d.rule == "no policy" and d.addresses == ()
    assert decide(t("169.254.169.254"), Policy.allow_all()).allowed
    assert not needs_addresses(Policy.allow_all())


def test_resolves_at_exit_never_looks_up():
    d = decide(t("api.github.com"), AGENT, resolves_at_exit=True)
    assert d.allowed and d.addresses == ()
    assert not decide(t("evil.example2"), AGENT, resolves_at_exit=True).allowed
    # IP literals still get every check
    assert decide(t("10.0.0.1"), AGENT, resolves_at_exit=True).rule == "deny_private"


def test_check_policy_for_path():
    assert check_policy_for_path(AGENT, True) is None           # deny_private, default deny
    assert check_policy_for_path(AGENT, False) is None
    p = policy('default = "allow"\ndeny_private = true\n')
    assert "deny_private" in check_policy_for_path(p, True)
    assert check_policy_for_path(p, False) is None
    p = policy('allow = ["a.com"]\ndeny = ["10.0.0.0/8"]\n')
    assert "10.0.0.0/8" in check_policy_for_path(p, True)
    assert check_policy_for_path(Policy.allow_all(), True) is None


def test_needs_addresses():
    assert needs_addresses(AGENT)
    assert not needs_addresses(policy('allow = ["a.com"]\ndeny = ["*.b.com"]\n'))
    assert not needs_addresses(policy('allow = ["140.82.112.0/20"]\n'))
    assert needs_addresses(policy('deny = ["140.82.112.0/20"]\n'))


# --- scale ---------------------------------------------------------------------------

def test_ten_thousand_rules():
    allow = [f'"host{i}.example.com"' for i in range(5000)]
    allow += [f'"*.zone{i}.example.net"' for i in range(4990)]
    allow += [f'"10.{i}.0.0/16"' for i in range(10)]
    big = policy(f"allow = [{', '.join(allow)}]\n")
    assert len(big.allow) == 10_000
    d = decide(t("host4999.example.com"), big, [A("140.82.112.6")])
    assert d.allowed and d.rule == 'allow "host4999.example.com" (line 4)'
    assert decide(t("a.b.zone4989.example.net"), big, [A("140.82.112.6")]).allowed
    assert not decide(t("zone4989.example.net"), big, [A("140.82.112.6")]).allowed
    assert decide(t("10.9.1.1"), big).allowed
    assert not decide(t("10.10.1.1"), big).allowed

"""decide(): the six steps, in order, first decision wins."""
from __future__ import annotations

from ipaddress import ip_address

import pytest

from stages.broker.decide import BadTarget, Decision, LookUp, Target, decide, machine_check, parse_target
from stages.config.policy import Policy, check_policy_for_path

from policy_support import policy, t

A = ip_address


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
    assert decide(t("203.0.113.9"), Policy.allow_all()).allowed


# --- step 4: the machine itself, with a policy or without -----------------------

NO_DP = policy('default = "allow"\ndeny_private = false\n', "open.toml")
MACHINE_LITERALS = [
    ("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("::1", "loopback"), ("0.0.0.0", "loopback"),
    ("::", "loopback"), ("::ffff:127.0.0.1", "loopback"), ("64:ff9b::7f00:1", "loopback"),
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"), ("100.100.100.200", "metadata"),
    ("169.254.1.1", "link-local"), ("fe80::1", "link-local"), ("::ffff:169.254.169.254", "metadata"),
]


@pytest.mark.parametrize("pol", [Policy.allow_all(), NO_DP], ids=["no-policy", "deny_private-false"])
@pytest.mark.parametrize("host,kind", MACHINE_LITERALS)
def test_step4_refuses_the_machine_by_literal(pol, host, kind):
    d = decide(t(host, 8080), pol)
    assert not d.allowed and d.rule == "machine", d
    if kind == "loopback":
        assert '"localhost:8080"' in d.reason and "door" in d.reason
    else:
        assert "which vpnw never dials without a rule naming it" in d.reason
        assert ("run it under a policy (--policy)" if pol.no_policy else "open.toml") in d.reason


@pytest.mark.parametrize("pol", [Policy.allow_all(), NO_DP], ids=["no-policy", "deny_private-false"])
@pytest.mark.parametrize("name", ["localhost", "api.localhost", "localhost.localdomain"])
def test_step4_refuses_localhost_names_before_any_look_up(pol, name):
    for at_exit in (False, True):
        d = decide(t(name, 18942), pol, resolves_at_exit=at_exit)
        assert not d.allowed and d.rule == "machine" and d.addresses == (), d
        assert '"localhost:18942"' in d.reason


@pytest.mark.parametrize("pol", [Policy.allow_all(), NO_DP], ids=["no-policy", "deny_private-false"])
@pytest.mark.parametrize("address,rule", [("127.0.0.1", '"localhost:443"'),
                                          ("169.254.169.254", '"169.254.169.254:443"'),
                                          ("10.1.2.3", '"10.1.2.3:443"')])
def test_step4_judges_every_address_a_name_is_dialled_at(pol, address, rule):
    local = frozenset({A("10.1.2.3")})
    d = machine_check(t("metadata.world"), pol, [A("203.0.113.1"), A(address)], local)
    assert d is not None and not d.allowed and d.rule == "machine", d
    assert d.reason.startswith(f"metadata.world:443 resolved to {address}: ") and rule in d.reason
    assert machine_check(t("metadata.world"), pol, [A("203.0.113.1")], local) is None


def test_step4_an_address_rule_opens_metadata_link_local_and_own_addresses_but_not_the_loopback():
    p = policy('default = "deny"\nallow = ["169.254.169.254:80", "10.1.2.3", "fe80::/10", "127.0.0.1",'
               ' "*.world", "0.0.0.0/0"]\n')
    local = frozenset({A("10.1.2.3")})
    assert decide(t("169.254.169.254", 80), p).allowed
    assert decide(t("10.1.2.3", 22), p, local_addresses=local).allowed
    assert decide(t("fe80::1", 22), p).allowed
    assert decide(t("169.254.169.254", 81), p).rule == "machine"     # the rule names port 80 only
    assert decide(t("169.254.1.1", 80), p).rule == "machine"         # 0.0.0.0/0 names nothing
    assert decide(t("127.0.0.1", 80), p).rule == "machine"           # the loopback: the door only
    assert machine_check(t("metadata.world", 80), p, [A("169.254.169.254")]) is None
    assert machine_check(t("metadata.world", 81), p, [A("169.254.169.254")]).rule == "machine"


def test_step4_under_a_localhost_rule_points_at_its_door():
    p = policy('allow = ["localhost:18941"]\n', "agent.toml")
    d = decide(t("127.0.0.1", 18941), p)
    assert d.rule == "machine"
    assert ('the allow rule "localhost:18941" (agent.toml line 4) opens it only at its own door inside '
            "the sandbox: connect to localhost:18941 directly, not through the proxy") in d.reason


def test_step4_can_be_left_out_only_by_the_caller():
    assert decide(t("127.0.0.1", 80), Policy.allow_all(), machine_step=False).allowed


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


def test_a_name_is_looked_up_only_when_an_address_could_refuse_it():
    """decide() asks for the addresses (LookUp) only under deny_private or
    an address deny rule; name rules and address allow rules never need them."""
    assert isinstance(decide(t("api.github.com"), AGENT), LookUp)
    assert not isinstance(decide(t("a.com"), policy('allow = ["a.com"]\ndeny = ["*.b.com"]\n')), LookUp)
    assert not isinstance(decide(t("a.com"), policy('allow = ["140.82.112.0/20"]\n')), LookUp)
    assert isinstance(decide(t("a.com"), policy('deny = ["140.82.112.0/20"]\n')), LookUp)


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

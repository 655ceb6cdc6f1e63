"""A policy and a target as the decision's and the policy's tests write them."""
from __future__ import annotations

from stages.broker.decide import Target, parse_target
from stages.config.policy import Policy, parse_policy


def policy(body: str, source: str = "agent.toml") -> Policy:
    """A policy named agent whose [policy] table is `body`."""
    return parse_policy('version = 1\nname = "agent"\n[policy]\n' + body, source)


def t(host: str, port: int = 443) -> Target:
    return parse_target(host, port)

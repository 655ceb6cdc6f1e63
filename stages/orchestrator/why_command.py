"""`vpnw why HOST[:PORT]`: which step of the decision and which rule decide
a destination, where that rule is written, and what the program would meet
(docs/architecture.md "vpnw why"). Nothing is dialled. A name is looked up
only where the broker would look it up (an address could change the
answer, or an allowed name is about to be dialled: step 4 judges every
address), and the answer says so; `--no-resolve` looks nothing up.

The pure core is `explain` (decide.py's steps, the same functions the
broker calls); the click command is its shell.
"""
from __future__ import annotations

import ipaddress
import re
import socket
import sys

import click

from stages.broker import decide as d
from stages.broker.local_addresses import local_addresses
from stages.config.policy import localhost_rule
from stages.orchestrator.run_command import UsageProblem, _load_path, _load_policy
from stages.wire.exits import ExitCode

STEPS = {
    1: "deny rules on the name",
    2: "deny rules on the addresses",
    3: "deny_private",
    4: "the machine itself",
    5: "allow rules",
    6: "the default",
}
DEFAULT_PORT = 443


class BadDestination(ValueError):
    """`HOST[:PORT]` that names no destination; str() says why."""


def parse_destination(text: str) -> tuple[str, int]:
    """`evil.example`, `evil.example:80`, `10.0.0.1:22`, `[::1]:8080`, `::1`
    -> (host, port); the port is 443 when none is written."""
    host, port = text, None
    if text.startswith("["):
        end = text.find("]")
        if end == -1:
            raise BadDestination(f"{text!r}: an opening [ without its ]")
        host, rest = text[1:end], text[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise BadDestination(f"{text!r}: after ] comes :PORT or nothing")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    if port is None:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise BadDestination(f"{text!r}: {port!r} is not a port (1 to 65535)")
    return host, int(port)


def step_of(decision, target) -> int | None:
    """The step (1-6) that made `decision`; None without a policy's rule
    (no policy allowing, a refused request)."""
    rule = decision.rule
    if rule.startswith("deny "):
        # An address literal meets only address rules; a name, its own
        # rules first and its addresses' once looked up.
        return 2 if target.ip is not None or " resolved to " in decision.reason else 1
    if rule.startswith("allow "):
        return 5
    return {"deny_private": 3, d.MACHINE: 4, "default": 6}.get(rule)


def what_the_program_meets(decision, target, policy) -> list[str]:
    """At each door, what the program would read."""
    if decision.allowed:
        return ["the HTTP and SOCKS5 doors and capture dial it through the run's path"]
    lines = [f'the HTTP door and a captured plain-HTTP request: 403, body "vpnw: {target} denied: " '
             "and the reason",
             "SOCKS5: reply 0x02 (not allowed by ruleset)",
             "a captured TLS connection: the TLS alert access_denied after its ClientHello"]
    if target.ip is None and d.machine_name(target.host) is None:
        refused = d.name_refusal(target.host, policy)
        lines.append("the DNS door (with --capture): a made-up address, with the reason as an Extended "
                     "DNS Error to a query with EDNS (dig); the connection is refused" if refused else
                     "the DNS door (with --capture): a made-up address; the connection is refused")
    return lines


def where_written(decision, policy) -> str | None:
    """`agent.toml line 7` for the rule or setting that decided, if written."""
    source = policy.source
    if source is None:
        return None
    found = re.search(r"\(line (\d+)\)$", decision.rule)
    if found:
        return f"{source} line {found.group(1)}"
    if decision.rule == "deny_private" and policy.deny_private_line:
        return f"{source} line {policy.deny_private_line}"
    return None


def _local_door(target, policy) -> list[str]:
    """The door `localhost:PORT` opens, when the target is the loopback and
    the policy names that port."""
    loopback = target.host == "localhost" if target.ip is None else target.ip.is_loopback
    rule = None if policy.no_policy or not loopback else localhost_rule(policy, target.port)
    if rule is None:
        return []
    return [f"  allowed at the door localhost:{target.port} inside the sandbox: allow rule "
            f"\"{rule.text}\" ({policy.where(rule)}); the program connects to localhost:{target.port} "
            f"itself and reaches this machine's port {target.port}",
            "  at a proxy door or through capture:"]


def explain(target, policy, *, path, local_addresses=frozenset(), lookup=None) -> tuple[bool | None, list[str]]:
    """(allowed, or None when undecided without a look-up; the lines to
    print). `lookup(host, port)`: the addresses of a name, or None not to
    look anything up. Pure but for `lookup`."""
    at_exit = path.resolves_at_exit
    tunnel_dns = path.type == "wireguard"
    where = policy.source or "no policy (vpnw run/trace without --policy)"
    lines = [f"{target} under {where}, path {path.describe()}"]
    looked_up = None
    verdict = d.decide(target, policy, None, local_addresses=local_addresses, resolves_at_exit=at_exit)
    machine = None
    if isinstance(verdict, d.LookUp) or (isinstance(verdict, d.Decision) and verdict.allowed and target.ip is None
                                         and not verdict.addresses and not at_exit):
        # The broker looks the name up here: to decide, or to dial it (step 4).
        if lookup is None or tunnel_dns:
            why = ("the run would look it up through the tunnel's DNS, which `why` does not reach"
                   if tunnel_dns else "--no-resolve")
            if isinstance(verdict, d.LookUp):
                lines.append(f"  undecided: the answer depends on the addresses {target.host} resolves "
                             f"to (deny rules on addresses, deny_private, step 4); not looked up: {why}")
                return None, lines
            lines.append(f"  not looked up ({why}): step 4 would still judge every address "
                         f"{target.host} is dialled at")
        else:
            try:
                looked_up = lookup(target.host, target.port)
            except OSError as exc:
                lines.append(f"  looked up here, as the broker would: {target.host} did not resolve "
                             f"({exc.strerror or exc}); the run would fail the connection (conn.fail, dns)")
                return None, lines
            if isinstance(verdict, d.LookUp):
                verdict = d.decide(target, policy, looked_up, local_addresses=local_addresses)
            else:
                machine = d.machine_check(target, policy, looked_up, local_addresses)
    if machine is not None:
        verdict = machine
    door = _local_door(target, policy)
    lines += door
    step = step_of(verdict, target)
    word = "allowed" if verdict.allowed else "denied"
    if step is not None:
        lines.append(f"  {word} at step {step} ({STEPS[step]}), rule: {verdict.rule}")
    else:
        lines.append(f"  {word}: {verdict.rule}")
    written = where_written(verdict, policy)
    if written:
        lines.append(f"  written at: {written}")
    lines.append(f"  reason: {verdict.reason}")
    lines += [f"  the program meets: {line}" for line in what_the_program_meets(verdict, target, policy)]
    if looked_up is not None:
        shown = ", ".join(str(a) for a in looked_up)
        lines.append(f"  looked up here, as the broker would: {target.host} -> {shown}")
    elif target.ip is None and at_exit:
        lines.append("  not looked up: this path resolves names at its exit, where vpnw never "
                     "sees the addresses")
    elif target.ip is None and verdict.allowed is False:
        lines.append("  not looked up: a denied name never is")
    lines.append("  nothing was dialled")
    return bool(door) or verdict.allowed, lines


def _lookup(host: str, port: int) -> tuple:
    found = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        if family in (socket.AF_INET, socket.AF_INET6):
            ip = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
            if ip not in found:
                found.append(ip)
    if not found:
        raise OSError(0, "no addresses")
    return tuple(found)


@click.command("why")
@click.argument("destination", metavar="HOST[:PORT]")
@click.option("--policy", "policy_file", metavar="FILE", help="The policy to ask (a file, or @PRESET); "
              "none: as vpnw run and trace without one.")
@click.option("--config", "config_file", metavar="FILE", help="The paths config, for --via.")
@click.option("--via", metavar="NAME", help="The path the run would take (it decides where names are "
              "resolved).")
@click.option("--no-resolve", is_flag=True, help="Look no name up, even where the broker would.")
def why_command(destination, policy_file, config_file, via, no_resolve):
    """Say which step and rule decide HOST[:PORT] (443 when no port is
    given), where the rule is written, and what the program would meet at
    each door. Nothing is dialled; a name is looked up only where the
    broker would, and the answer says so. Exit 120 when denied, 121 for a
    bad destination, policy or config, else 0 (allowed, or undecided
    without a look-up).

    \b
    Examples:
      vpnw why --policy agent.toml evil.example
      vpnw why --policy agent.toml localhost:8080
      vpnw why --config paths.toml --via office --policy agent.toml 10.1.2.3:22
    """
    try:
        host, port = parse_destination(destination)
        target = d.parse_target(host, port)
    except (BadDestination, d.BadTarget) as exc:
        click.echo(f"vpnw why: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    try:
        policy = _load_policy(policy_file)
        path, _ = _load_path(config_file, via)
    except UsageProblem as exc:
        exc.show()
        sys.exit(exc.exit_code)
    allowed, lines = explain(target, policy, path=path, local_addresses=local_addresses(),
                             lookup=None if no_resolve else _lookup)
    for line in lines:
        click.echo(line)
    sys.exit(ExitCode.DENIED if allowed is False else 0)

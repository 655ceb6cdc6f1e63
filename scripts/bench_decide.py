#!/usr/bin/env python3
"""How fast is decide()? Decisions per second and p50/p99 latency for a
10-rule and a 10,000-rule policy, on names that hit an exact rule, a wildcard,
and nothing at all. Pure CPU: no sockets, no look-ups.

    /opt/vpnw-venv/bin/python scripts/bench_decide.py [--n 50000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from ipaddress import ip_address

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stages.broker.decide import decide, parse_target  # noqa: E402
from stages.config.policy import parse_policy  # noqa: E402


def make_policy(n_rules: int):
    exact = [f'"host{i}.example.com"' for i in range(n_rules // 2)]
    wild = [f'"*.zone{i}.example.net"' for i in range(n_rules - n_rules // 2 - 2)]
    deny = ['"*.evil.example"', '"10.0.0.0/8"']
    text = ('version = 1\nname = "bench"\n[policy]\ndefault = "deny"\ndeny_private = true\n'
            f"allow = [{', '.join(exact + wild)}]\ndeny = [{', '.join(deny)}]\n")
    started = time.perf_counter()
    policy = parse_policy(text, "bench.toml")
    return policy, time.perf_counter() - started


def cases(n_rules: int):
    last_exact = n_rules // 2 - 1
    last_wild = n_rules - n_rules // 2 - 3
    addrs = (ip_address("140.82.112.6"), ip_address("2606:4700::1111"))
    return {
        "exact": (parse_target(f"host{last_exact}.example.com", 443), addrs),
        "wildcard": (parse_target(f"a.b.zone{last_wild}.example.net", 443), addrs),
        "unmatched": (parse_target("nothing.matches.example.org", 443), None),
    }


def measure(policy, target, addresses, n: int):
    for _ in range(1000):
        decide(target, policy, addresses)
    samples = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        decide(target, policy, addresses)
        samples.append(clock() - t0)
    started = time.perf_counter()
    for _ in range(n):
        decide(target, policy, addresses)
    rate = n / (time.perf_counter() - started)
    samples.sort()
    return rate, samples[len(samples) // 2] / 1000, samples[int(len(samples) * 0.99)] / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000, help="decisions per measurement")
    args = ap.parse_args()
    print(f"{'rules':>6}  {'case':<10} {'decisions/s':>12} {'p50 µs':>8} {'p99 µs':>8}  result")
    for n_rules in (10, 10_000):
        policy, load_s = make_policy(n_rules)
        for name, (target, addresses) in cases(n_rules).items():
            rate, p50, p99 = measure(policy, target, addresses, args.n)
            d = decide(target, policy, addresses)
            print(f"{n_rules:>6}  {name:<10} {rate:>12,.0f} {p50:>8.2f} {p99:>8.2f}  "
                  f"{'allow' if d.allowed else 'deny'} ({d.rule})")
        print(f"{n_rules:>6}  parse+index of the policy file: {load_s * 1000:.1f} ms")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; "
          "exact/wildcard cases check 2 addresses (deny_private on)")


if __name__ == "__main__":
    main()

"""The broker alone: python -m stages.broker --handoff-fd N [--policy FILE]
[--config FILE --via NAME] [--dry-run] [--status-fd N]

Events go to stdout as JSON Lines; status lines to stderr unless --status-fd.
Exit codes: 0 done, 121 bad policy/config, 123 path down, 125 broker failure.
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stages.broker",
                                     description="vpnw broker: decide, dial, relay, record.")
    parser.add_argument("--handoff-fd", type=int, required=True,
                        help="broker end of the helper's SOCK_SEQPACKET link")
    parser.add_argument("--policy", help="policy file (default: allow everything)")
    parser.add_argument("--config", help="paths config")
    parser.add_argument("--via", help="path name from --config (default: the config's default, or direct)")
    parser.add_argument("--dry-run", action="store_true", help="record denials but let connections through")
    parser.add_argument("--status-fd", type=int, default=2, help="where status lines go (default: stderr)")
    parser.add_argument("--run-id", help="run id for the events (default: a new one)")
    parser.add_argument("--grace", type=float, default=2.0, help="seconds open relays get at the end")
    args = parser.parse_args(argv)

    # After the arguments are read, each: --help and a bad argument answer without them.
    from stages.wire.exits import ExitCode
    from stages.config.paths import ConfigError, choose_path, load_config  # (as above)
    from stages.config.policy import Policy, PolicyError, check_policy_for_path, load_policy  # (as above)
    from stages.record.events import new_run_id  # (as above)
    try:
        policy = load_policy(args.policy) if args.policy else Policy.allow_all()
        config = load_config(args.config) if args.config else None
        path = choose_path(config, args.via)
    except (PolicyError, ConfigError) as exc:
        print(f"vpnw broker: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    problem = check_policy_for_path(policy, path.resolves_at_exit)
    if problem:
        print(f"vpnw broker: {problem}", file=sys.stderr)
        return ExitCode.USAGE
    from stages.broker.main import main_from_fds     # once the policy and path are good
    return main_from_fds(args.handoff_fd, 1, args.status_fd, run_id=args.run_id or new_run_id(),
                         policy=policy, path=path, dry_run=args.dry_run, grace=args.grace)


if __name__ == "__main__":
    sys.exit(main())

"""Run by tests/test_startup_imports.py: what vpnw loads before it forks
on a run with no --policy and no --config."""
from stages.config import client_env, environment, file_limits, protected  # noqa: F401 (loaded, as in a run)
from stages.config.policy import check_policy_for_path
from stages.orchestrator import cli, run  # noqa: F401
from stages.record import gate  # noqa: F401

policy = cli._load_policy(None)
path, named = cli._load_path(None, None)
check_policy_for_path(policy, path.resolves_at_exit)

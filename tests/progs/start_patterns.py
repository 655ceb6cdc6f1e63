"""Run by tests/test_start_patterns.py. As vpnw's run does it
(run_command._load_policy, _load_path), with nothing named; then, with
CONTROL, a policy and a config that use every pattern."""
import json
import re
import sys
from stages.orchestrator import run_command
run_command._load_policy(None)
run_command._load_path(None, None)
plain = sorted(key[1] for key in re._cache if isinstance(key[1], str))
if sys.argv[1:]:
    policy, config, conf = sys.argv[1:]
    loaded = run_command._load_policy(policy)
    run_command._load_path(config, "office")
    refused = []
    for text in ('version = 1\n[policy]\nallow = ["x.example:70000"]\n',
                 'version = 1\n[unix]\nallow = ["$1BAD"]\n'):
        open(policy, "w").write(text)
        try:
            run_command._load_policy(policy)
        except run_command.UsageProblem as exc:
            refused.append(str(exc))
    try:
        run_command._load_path(conf, None)
    except run_command.UsageProblem as exc:
        refused.append(str(exc))
    print(json.dumps([plain, sorted(key[1] for key in re._cache if isinstance(key[1], str)),
                      len(loaded.allow), refused]))
else:
    print(json.dumps([plain]))

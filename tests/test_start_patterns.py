"""The policy's and the paths config's regular expressions are compiled on
first use, not when vpnw imports them (stages/config/policy.py, paths.py;
docs/architecture.md, "Start-up budget"): a run with no policy, no config
and no --via loads both modules on its way to the recorder's fork and
compiles none of them. Control: a policy with a port and a `$VARIABLE`
socket, and a config whose path has a name, compile theirs, and what they
accept and refuse is the same."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from progs_support import prog_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OURS = {r"\$[A-Za-z_][A-Za-z0-9_]*", r"[1-9][0-9]{0,4}", r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z",
        r"^\s*\[Interface\]\s*$(?s:.*)^\s*PrivateKey\s*="}

# As vpnw's run does it (run_command._load_policy, _load_path), with nothing
# named; then, with CONTROL, a policy and a config that use every pattern.
SCRIPT = prog_text("start_patterns.py")


def _run(*args: str) -> list:
    out = subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd="/",
                         env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_a_run_with_nothing_named_compiles_none_of_their_patterns():
    plain, = _run()
    assert not OURS & set(plain), plain


def test_control_a_policy_and_a_config_that_use_them_compile_them_and_refuse_the_same(tmp_path):
    policy, config, conf = tmp_path / "policy.toml", tmp_path / "paths.toml", tmp_path / "wg0.conf"
    policy.write_text('version = 1\n[policy]\ndefault = "deny"\n'
                      'allow = ["x.example:443", "localhost:8080"]\n[unix]\nallow = ["$SSH_AUTH_SOCK"]\n')
    config.write_text('version = 1\nname = "office"\n[paths.office]\ntype = "proxy"\nurl = "http://proxy.example:3128"\n')
    conf.write_text("[Interface]\nPrivateKey = x\n")
    _plain, after, allowed, refused = _run(str(policy), str(config), str(conf))
    assert OURS <= set(after), after          # the check sees a compiled pattern
    assert allowed == 2
    assert len(refused) == 3
    assert '"x.example:70000"' in refused[0] and "port" in refused[0]
    assert "$1BAD" in refused[1]
    assert "wg0.conf: is a WireGuard (wg-quick) file, not a paths" in refused[2]

"""Run by tests/test_startup_imports.py: what vpnw (the policy's digest),
the recorder (the digest chain) and the signing (BLAKE2b of the file) load.
argv: a policy file, a record."""
import os
import sys

# ruff: noqa: I001 (the order vpnw loads them in)
from stages.config.policy import load_policy
from stages.orchestrator import cli, run  # noqa: F401 (loaded, as in a run)
from stages.recorder import main, seal  # noqa: F401
from stages.record import chain, ledger, signing  # noqa: F401

policy, record = sys.argv[1:3]
load_policy(policy)
fd = os.open(record, os.O_RDONLY)
signing.file_digest(fd)
chain.Chain().seal(b'{"type":"run.start"}')

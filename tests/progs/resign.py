"""Run by tests/test_e2e_chain_heads.py. What the same user can do with their
own key: sign the rewritten file again and fix its ledger entry (the vpnw
code they have), as an attacker would."""
import os
import sys
from stages.record import signing
path = sys.argv[1]
key = signing.load_secret()
fd = os.open(path, os.O_RDONLY)
digest, lines = signing.file_digest(fd)
with open(path + ".minisig", "w") as out:
    out.write(key.sign_file_digest(digest, "vpnw forged", "forged"))

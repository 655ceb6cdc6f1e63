"""SHA-256 and BLAKE2b from CPython's own hash modules, `_sha256`/`_sha2`
and `_blake2`, not hashlib, whose import first loads OpenSSL's libcrypto
(its `_hashlib`: about 2.3 ms of the recorder's start) although these two
digests come out the same from the modules CPython builds in (random.py
takes its SHA-512 from `_sha512` for the same reason); a start-up trick,
stages/startup/tricks.py. A build without them, and the tricks off, get
hashlib's. Apart from c_halves.py: vpnw forks the helper before it needs
a digest."""
from __future__ import annotations

from stages import startup

if startup.ON:
    try:
        from _sha256 import sha256          # CPython 3.11
    except ImportError:                     # pragma: no cover - 3.12 and later name it _sha2
        try:
            from _sha2 import sha256
        except ImportError:
            from hashlib import sha256
    try:
        from _blake2 import blake2b
    except ImportError:                     # pragma: no cover - a Python built without it
        from hashlib import blake2b
else:
    from hashlib import blake2b, sha256

__all__ = ["sha256", "blake2b"]

"""SHA-256 and BLAKE2b for the record: CPython's own hash modules, not
hashlib (a start-up trick: stages/startup/c_digests.py says why)."""
from __future__ import annotations

from stages.startup.c_digests import blake2b, sha256

__all__ = ["sha256", "blake2b"]

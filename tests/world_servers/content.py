"""Deterministic payloads for the test world.

The server streams `/bytes/<n>?seed=s` from here, the upload clients send the
same bytes, and the tests compute the expected sha256 from here too, so a
relay that drops, repeats or reorders a single byte is caught. Blocks are not
repeated: every MiB of a payload is fresh output of a seeded generator.
"""
from __future__ import annotations

import hashlib
import random
from typing import Iterator

CHUNK = 1 << 20


def payload_chunks(size: int, seed: str | int) -> Iterator[bytes]:
    rng = random.Random(f"vpnw-world:{seed}")
    left = size
    while left > 0:
        n = min(CHUNK, left)
        yield rng.randbytes(n)
        left -= n


def payload(size: int, seed: str | int) -> bytes:
    return b"".join(payload_chunks(size, seed))


def payload_sha256(size: int, seed: str | int) -> str:
    digest = hashlib.sha256()
    for chunk in payload_chunks(size, seed):
        digest.update(chunk)
    return digest.hexdigest()

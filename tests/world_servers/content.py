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


# The stand-in model APIs and the token-guarded git repository of the test
# world (http_server.py): each answers only with its real credential, which
# vpnw's secret doors add (tests/test_e2e_secrets.py). Shaped as the real
# services' keys; they exist only in the test world.
OPENAI_REAL_KEY = "sk-proj-WORLDREALKEY0openai0d41d8cd98f00b204e9800998ecf8427e"
ANTHROPIC_REAL_KEY = "sk-ant-api03-WORLDREALKEY0anthropic0a1b2c3d4e5f60718293a4b5c6d7e8f9"
GIT_REAL_TOKEN = "ghp_WORLDREALTOKEN0git0aa11bb22cc33dd44ee55"
MODEL_HOSTS = {"api.openai.com": "openai", "api.anthropic.com": "anthropic"}
MODEL_ANSWER = "hello from the stand-in model"

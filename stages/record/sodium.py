"""Ed25519 from libsodium, through ctypes: the three calls the signed end
needs (docs/record.md, "The signed end").

libsodium is minisign's own library (Debian's libsodium23, which minisign
depends on), so vpnw signs and checks with the implementation the stock tool
uses. Called through `_ctypes` alone (stages/kernel/foreign.py: not even the
`ctypes` package, ~2 ms of CPU on the recorder's way to run.start) it loads
in well under a millisecond, where a Python crypto package costs 20-45 ms to
import: the difference between a short run that waits for its signature and
one that does not (issue 30's measure).

BLAKE2b-512, the other half of minisign's "ED" signature, is hashlib's.
"""
from __future__ import annotations

from stages.kernel import foreign

# Every libsodium since 1.0.12 (2017) has this soname; Debian 12 ships 1.0.18.
SONAME = "libsodium.so.23"
SEED_BYTES = PUBLIC_BYTES = 32
SECRET_BYTES = SIGNATURE_BYTES = 64

_uchar_p = foreign.c_char_p


class SodiumMissing(OSError):
    """libsodium cannot be loaded or initialised: nothing can be signed or
    checked. The message names the package that brings it."""


_library = None


def library():
    """libsodium, loaded and initialised once per process. Raises SodiumMissing."""
    global _library
    if _library is None:
        _library = _load()
    return _library


def _load():
    try:
        lib = foreign.Library(SONAME)
    except OSError as exc:
        raise SodiumMissing(f"libsodium, which signs vpnw's runs, cannot be loaded ({exc}); fix: "
                            "install it (Debian: apt-get install libsodium23; scripts/setup "
                            "does)") from None
    void_p, size_t, ulonglong = foreign.c_void_p, foreign.c_size_t, foreign.c_ulonglong
    # sodium_init: 0 done now, 1 already done, -1 failed (no randomness source).
    if lib.function("sodium_init", ())() < 0:
        raise SodiumMissing("libsodium, which signs vpnw's runs, failed to initialise")
    return _Sodium(
        crypto_sign_seed_keypair=lib.function("crypto_sign_seed_keypair", (void_p, void_p, _uchar_p)),
        crypto_sign_detached=lib.function("crypto_sign_detached",
                                          (void_p, void_p, _uchar_p, ulonglong, void_p)),
        crypto_sign_verify_detached=lib.function("crypto_sign_verify_detached",
                                                 (_uchar_p, _uchar_p, ulonglong, _uchar_p)),
        sodium_memzero=lib.function("sodium_memzero", (void_p, size_t), restype=None))


class _Sodium:
    """The four functions, bound once."""

    def __init__(self, **functions):
        self.__dict__.update(functions)


def _keypair(lib, seed: bytes):
    if len(seed) != SEED_BYTES:
        raise ValueError("an Ed25519 seed is 32 bytes")
    public = foreign.buffer(PUBLIC_BYTES)
    secret = foreign.buffer(SECRET_BYTES)
    if lib.crypto_sign_seed_keypair(public, secret, seed) != 0:
        raise SodiumMissing("libsodium could not derive a key pair")
    return public, secret


def public_key(seed: bytes) -> bytes:
    """The Ed25519 public key of a 32-byte seed (RFC 8032)."""
    lib = library()
    public, secret = _keypair(lib, seed)
    lib.sodium_memzero(secret, SECRET_BYTES)
    return public.raw


def sign(seed: bytes, message: bytes) -> bytes:
    """`message`'s Ed25519 signature (64 bytes) with the key of `seed`; the
    expanded secret key lives only for this call and is wiped after it."""
    lib = library()
    _public, secret = _keypair(lib, seed)
    try:
        out = foreign.buffer(SIGNATURE_BYTES)
        if lib.crypto_sign_detached(out, None, message, len(message), secret) != 0:
            raise SodiumMissing("libsodium could not sign")
        return out.raw
    finally:
        lib.sodium_memzero(secret, SECRET_BYTES)


def verify(public: bytes, signature: bytes, message: bytes) -> bool:
    """True when `signature` is `public`'s Ed25519 signature of `message`."""
    if len(public) != PUBLIC_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    return library().crypto_sign_verify_detached(signature, message, len(message), public) == 0

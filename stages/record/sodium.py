"""Ed25519 from libsodium, through ctypes: the three calls the signed end
needs (docs/record.md, "The signed end").

libsodium is minisign's own library (Debian's libsodium23, which minisign
depends on), so vpnw signs and checks with the implementation the stock tool
uses. Through ctypes it loads in well under a millisecond in a process that
has ctypes already (every stage does: run.py's PDEATHSIG), where a Python
crypto package costs 20-45 ms to import: the difference between a short run
that waits for its signature and one that does not (issue 30's measure).

BLAKE2b-512, the other half of minisign's "ED" signature, is hashlib's.
"""
from __future__ import annotations

import ctypes

# Every libsodium since 1.0.12 (2017) has this soname; Debian 12 ships 1.0.18.
SONAME = "libsodium.so.23"
SEED_BYTES = PUBLIC_BYTES = 32
SECRET_BYTES = SIGNATURE_BYTES = 64

_uchar_p = ctypes.c_char_p


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
        lib = ctypes.CDLL(SONAME)
    except OSError as exc:
        raise SodiumMissing(f"libsodium, which signs vpnw's runs, cannot be loaded ({exc}); fix: "
                            "install it (Debian: apt-get install libsodium23; scripts/setup "
                            "does)") from None
    # sodium_init: 0 done now, 1 already done, -1 failed (no randomness source).
    lib.sodium_init.restype = ctypes.c_int
    if lib.sodium_init() < 0:
        raise SodiumMissing("libsodium, which signs vpnw's runs, failed to initialise")
    lib.crypto_sign_seed_keypair.argtypes = (ctypes.c_void_p, ctypes.c_void_p, _uchar_p)
    lib.crypto_sign_detached.argtypes = (ctypes.c_void_p, ctypes.c_void_p, _uchar_p,
                                         ctypes.c_ulonglong, ctypes.c_void_p)
    lib.crypto_sign_verify_detached.argtypes = (_uchar_p, _uchar_p, ctypes.c_ulonglong, _uchar_p)
    lib.sodium_memzero.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    lib.sodium_memzero.restype = None
    for name in ("crypto_sign_seed_keypair", "crypto_sign_detached", "crypto_sign_verify_detached"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _keypair(lib, seed: bytes):
    if len(seed) != SEED_BYTES:
        raise ValueError("an Ed25519 seed is 32 bytes")
    public = ctypes.create_string_buffer(PUBLIC_BYTES)
    secret = ctypes.create_string_buffer(SECRET_BYTES)
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
        out = ctypes.create_string_buffer(SIGNATURE_BYTES)
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

"""The DNS door's made-up addresses (docs/architecture.md "The DNS door"):
one address per name from 198.18.0.0/15 (RFC 2544, set aside for
benchmarking, never a real destination), given in this run and mapped back
to the name by every door, so the policy decides the name exactly as if the
program had asked a proxy for it.

Each run starts at a random place in the pool, so an address another run
gave is unlikely to be one this run gave too; an address of the pool that
this run never gave is refused, never dialled.

The table lives in shared memory made before the broker's workers are forked
(a memfd, MAP_SHARED): the lead answers every DNS query and writes the name
into the address's slot before it sends the answer, so a worker that takes
the program's connection to that address later reads the name there. Only
the lead writes. A slot is 256 bytes (a length byte and the name, at most
253); 2**17 slots are 32 MiB of address space, of which only the pages of
slots used are ever memory.
"""
from __future__ import annotations

import ipaddress
import mmap
import os
import secrets

POOL = ipaddress.IPv4Network("198.18.0.0/15")
SLOTS = POOL.num_addresses
SLOT_SIZE = 256
_BASE = int(POOL.network_address)


class PoolFull(Exception):
    pass


class FakeNames:
    """name <-> made-up address for one run. The pure part is the mapping;
    the memory it lives in is given (an mmap, or a bytearray in tests)."""

    def __init__(self, memory=None, start: int | None = None):
        self.fd = None
        if memory is None:
            self.fd = os.memfd_create("vpnw-fake-names", os.MFD_CLOEXEC)
            os.ftruncate(self.fd, SLOTS * SLOT_SIZE)
            memory = mmap.mmap(self.fd, SLOTS * SLOT_SIZE)
        self.memory = memory
        self.start = secrets.randbelow(SLOTS) if start is None else start % SLOTS
        self.given: dict[str, ipaddress.IPv4Address] = {}   # the lead's: name -> address

    def address_for(self, name: str) -> ipaddress.IPv4Address:
        """This run's address for `name` (a canonical ASCII name), the same
        one every time. Raises PoolFull when every address is given."""
        found = self.given.get(name)
        if found is not None:
            return found
        if len(self.given) >= SLOTS:
            raise PoolFull(f"all {SLOTS} made-up addresses of this run are given")
        encoded = name.encode("ascii")
        if not 0 < len(encoded) < SLOT_SIZE:
            raise ValueError(f"a name of {len(encoded)} bytes")
        slot = (self.start + len(self.given)) % SLOTS
        at = slot * SLOT_SIZE
        self.memory[at + 1: at + 1 + len(encoded)] = encoded
        self.memory[at] = len(encoded)          # last: a reader sees a whole name or none
        address = ipaddress.IPv4Address(_BASE + slot)
        self.given[name] = address
        return address

    @staticmethod
    def in_pool(address) -> bool:
        return isinstance(address, ipaddress.IPv4Address) and address in POOL

    def name_for(self, address) -> str | None:
        """The name this run gave `address` to; None when it gave it to none
        (or the address is not in the pool)."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if not self.in_pool(address):
            return None
        at = (int(address) - _BASE) * SLOT_SIZE
        length = self.memory[at]
        if not length:
            return None
        return bytes(self.memory[at + 1: at + 1 + length]).decode("ascii")


def not_given_reason(address) -> str:
    return (f"{address} is an address vpnw's DNS door makes up, and this run gave it to no "
            "name (it comes from another run, or was guessed); nothing was dialled")

"""The records of device memory: allocations, the regions operands name, synthetic address spaces.

:mod:`computehal.memory` (the pointer table and leases) re-exports every name here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

from ._args import ceil_div

__all__ = ["ALIGNMENT", "AddressSpace", "Allocation", "AllocationInfo", "Region"]

#: Every allocation's base address is a multiple of this many bytes.
ALIGNMENT = 64


@dataclass(eq=False, slots=True)
class Allocation:
    """One allocation: ``size`` bytes at ``base``.

    ``payload`` is whatever the backend needs to reach the memory (a NumPy byte
    array, a ``cl.Buffer``, a wgpu buffer, a CuPy memory object). ``borrowed``
    allocations were registered from outside and are never freed by the backend.
    ``serial`` is unique in the process and never reused (an address may be, eventually);
    ``pins`` counts the operations using the allocation; ``freed`` is set when it is
    unregistered (its memory may still be pinned by a running operation). ``frozen``:
    no operation may write it any more (``PointerTable.freeze``); ``exposed``: a
    writable host view of it was handed out (it can then no longer be frozen).

    Two caches save objects on every call. ``whole`` is the region of the whole
    allocation, made by the first operand that spans it and handed to the next ones.
    ``view`` belongs to the backend (the CPU backend keeps a typed array over the whole
    block there, so an operand's array is a slice rather than a new buffer export); the
    table never reads it. The table clears both once no operation pins the allocation,
    before the memory is released, so a cached view never outlives its memory; a later
    allocation at the same address is another :class:`Allocation`, with empty caches.
    """

    base: int
    size: int
    payload: Any
    borrowed: bool = False
    serial: int = 0
    pins: int = 0
    freed: bool = False
    frozen: bool = False
    exposed: bool = False
    view: Any = None
    whole: Region | None = None

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.base + self.size


class AllocationInfo(NamedTuple):
    """What a backend tells about the allocation holding a pointer (see ``allocation_of``).

    ``serial`` identifies the allocation for the lifetime of its backend: a later
    allocation at the same address has another serial.
    """

    base: int
    size: int
    borrowed: bool
    serial: int


class Region(NamedTuple):
    """A validated byte range: ``nbytes`` bytes at ``offset`` inside ``allocation``.

    A named tuple rather than a dataclass: one is built per operand of every call, so
    construction cost is part of the per-call overhead.
    """

    allocation: Allocation
    offset: int
    nbytes: int

    @property
    def ptr(self) -> int:
        """The pointer this region starts at."""
        return self.allocation.base + self.offset

    @property
    def payload(self) -> Any:
        """The backend payload of the allocation holding this region."""
        return self.allocation.payload

    def overlaps(self, other: Region) -> bool:
        """True when both regions share at least one byte of the same allocation."""
        if self.allocation is not other.allocation or not self.nbytes or not other.nbytes:
            return False
        return self.offset < other.offset + other.nbytes and other.offset < self.offset + self.nbytes

    def shifted(self, nbytes: int) -> Region:
        """This region moved ``nbytes`` further into its allocation (the caller validated it)."""
        return Region(self.allocation, self.offset + nbytes, self.nbytes)

    def sized(self, nbytes: int) -> Region:
        """The first ``nbytes`` bytes of this region (the caller validated it)."""
        return Region(self.allocation, self.offset, nbytes)


class AddressSpace:
    """Hands out synthetic, never-reused, 64-byte-aligned addresses.

    Used by backends whose memory is a handle. Addresses are never reused, so a
    stale pointer to a freed buffer is always reported as freed or unknown rather
    than silently aliasing a newer allocation. A guard gap separates allocations so
    an off-by-a-few pointer past one allocation never lands inside the next.
    """

    def __init__(self, start: int = 0x7E00_0000_0000, guard: int = 4096) -> None:
        self._next = start
        self._guard = guard
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> int:
        """Return the base address for a new allocation of ``nbytes`` bytes."""
        with self._lock:
            base = self._next
            span = ceil_div(max(nbytes, 1), ALIGNMENT) * ALIGNMENT
            self._next = base + span + self._guard
            return base

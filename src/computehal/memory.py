"""Device-memory bookkeeping shared by every backend.

A pointer is a plain ``int``. Each backend keeps a :class:`PointerTable` of its live
allocations; before an operation touches memory it asks the table to
:meth:`~PointerTable.resolve` every operand's byte range to a :class:`Region` (one
allocation plus a byte offset). Interior pointers (base + offset) are valid, as on CUDA.

Backends whose native memory is a host address (CPU) or a real device address (CUDA)
register those addresses; backends whose memory is a handle (OpenCL ``cl_mem``, wgpu
buffers) take synthetic addresses from an :class:`AddressSpace` and keep the handle as
the allocation's payload.
"""

from __future__ import annotations

import bisect
import operator
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import InvalidArgumentError

__all__ = [
    "ALIGNMENT",
    "Allocation",
    "Region",
    "PointerTable",
    "AddressSpace",
    "as_pointer",
    "as_count",
]

#: Every allocation's base address is a multiple of this many bytes.
ALIGNMENT = 64

#: Largest count accepted anywhere (sizes, dimensions); anything larger cannot be
#: backed by memory on any machine and is rejected before arithmetic on it.
MAX_COUNT = 2**62


def as_count(name: str, value: object) -> int:
    """Return ``value`` as a non-negative ``int`` (a size, dimension or stride).

    Raises
    ------
    InvalidArgumentError
        If ``value`` is not an integer (``bool`` included), is negative, or exceeds 2**62.
    """
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an integer, got a bool")
    try:
        count = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer, got {type(value).__name__}") from None
    if count < 0:
        raise InvalidArgumentError(f"{name} must be >= 0, got {count}")
    if count > MAX_COUNT:
        raise InvalidArgumentError(f"{name} = {count} is too large")
    return count


def as_pointer(name: str, value: object) -> int:
    """Return ``value`` as a pointer ``int``; 0, negatives and non-integers are errors."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an integer pointer, got a bool")
    try:
        ptr = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer pointer, got {type(value).__name__}") from None
    if ptr == 0:
        raise InvalidArgumentError(f"{name} is a null pointer")
    if ptr < 0 or ptr >= 2**64:
        raise InvalidArgumentError(f"{name} = {ptr} is not a 64-bit address")
    return ptr


@dataclass(eq=False)
class Allocation:
    """One live allocation: ``size`` bytes at ``base``.

    ``payload`` is whatever the backend needs to reach the memory (a NumPy byte
    array, a ``cl.Buffer``, a wgpu buffer, a CuPy memory object). ``borrowed``
    allocations were registered from outside and are never freed by the backend.
    """

    base: int
    size: int
    payload: Any
    borrowed: bool = False

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.base + self.size


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


class PointerTable:
    """Thread-safe table of live allocations, keyed by base address.

    Lookups of interior pointers bisect the sorted list of bases, so each operand
    check costs O(log n) in the number of live allocations.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bases: list[int] = []
        self._by_base: dict[int, Allocation] = {}

    def insert(self, allocation: Allocation) -> None:
        """Register ``allocation``; its range must not overlap a live one."""
        with self._lock:
            i = bisect.bisect_right(self._bases, allocation.base)
            if i > 0 and self._by_base[self._bases[i - 1]].end > allocation.base:
                raise InvalidArgumentError(f"range at {allocation.base:#x} overlaps a live allocation")
            if i < len(self._bases) and self._bases[i] < allocation.end:
                raise InvalidArgumentError(f"range at {allocation.base:#x} overlaps a live allocation")
            self._bases.insert(i, allocation.base)
            self._by_base[allocation.base] = allocation

    def remove(self, name: str, ptr: object) -> Allocation:
        """Unregister and return the allocation whose base is ``ptr``.

        Raises
        ------
        InvalidArgumentError
            If ``ptr`` is not the base of a live allocation (unknown, interior,
            already freed).
        """
        address = as_pointer(name, ptr)
        with self._lock:
            allocation = self._by_base.pop(address, None)
            if allocation is None:
                inner = self._find(address)
                if inner is not None:
                    raise InvalidArgumentError(
                        f"{name} = {address:#x} points {address - inner.base} bytes into an "
                        f"allocation at {inner.base:#x}; only a base pointer can be freed"
                    )
                raise InvalidArgumentError(
                    f"{name} = {address:#x} is not a live allocation (never allocated or already freed)"
                )
            self._bases.pop(bisect.bisect_left(self._bases, address))
            return allocation

    def _find(self, address: int) -> Allocation | None:
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0:
            return None
        allocation = self._by_base[self._bases[i]]
        if address <= allocation.end:
            return allocation
        return None

    def resolve(self, name: str, ptr: object, nbytes: int, align: int = 1) -> Region:
        """Check that ``nbytes`` bytes at ``ptr`` lie inside one live allocation.

        A zero-byte range only needs ``ptr`` to point into (or one past the end of)
        a live allocation. ``align`` is the required alignment of ``ptr`` (the element
        size for typed operands: every device, and BLAS, needs naturally aligned data).

        Raises
        ------
        InvalidArgumentError
            Naming the argument, the pointer in hex, and the bytes needed vs available.
        """
        address = as_pointer(name, ptr)
        if address % align:
            raise InvalidArgumentError(f"{name} = {address:#x} is not aligned to its {align}-byte elements")
        with self._lock:
            allocation = self._find(address)
        if allocation is None:
            raise InvalidArgumentError(
                f"{name} = {address:#x} does not point into any live allocation of this backend"
            )
        available = allocation.end - address
        if nbytes > available or (nbytes > 0 and available == 0):
            raise InvalidArgumentError(
                f"{name} = {address:#x} needs {nbytes} bytes but only {available} remain in "
                f"its allocation ({allocation.size} bytes at {allocation.base:#x})"
            )
        return Region(allocation, address - allocation.base, nbytes)

    def live(self) -> list[Allocation]:
        """A snapshot of the live allocations, in address order."""
        with self._lock:
            return [self._by_base[b] for b in self._bases]

    def __len__(self) -> int:
        with self._lock:
            return len(self._bases)

    def drain(self) -> list[Allocation]:
        """Unregister and return every live allocation."""
        with self._lock:
            allocations = [self._by_base[b] for b in self._bases]
            self._bases.clear()
            self._by_base.clear()
            return allocations


class AddressSpace:
    """Hands out synthetic, never-reused, 64-byte-aligned addresses.

    Used by backends whose memory is a handle. Addresses are never reused, so a
    stale pointer to a freed buffer is always reported as unknown rather than
    silently aliasing a newer allocation. A guard gap separates allocations so an
    off-by-a-few pointer past one allocation never lands inside the next.
    """

    def __init__(self, start: int = 0x7E00_0000_0000, guard: int = 4096) -> None:
        self._next = start
        self._guard = guard
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> int:
        """Return the base address for a new allocation of ``nbytes`` bytes."""
        with self._lock:
            base = self._next
            span = -(-max(nbytes, 1) // ALIGNMENT) * ALIGNMENT
            self._next = base + span + self._guard
            return base

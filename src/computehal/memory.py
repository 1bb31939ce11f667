"""Device-memory bookkeeping shared by every backend.

A pointer is a plain ``int``. Each backend keeps a :class:`PointerTable` of its live
allocations. An operation opens a :class:`Lease` on the table and asks it to
:meth:`~Lease.resolve` every operand's byte range to a :class:`Region` (one allocation
plus a byte offset). A lease *pins* each allocation it resolves until the operation
ends: a :meth:`PointerTable.free` from any thread (or from a hostile ``__index__`` in
the same call) unregisters the pointer at once, so that nothing new can name it, but the
memory is released only when the last lease holding it ends. Interior pointers (base +
offset) are valid, as on CUDA.

Backends whose native memory is a host address (CPU) or a real device address (CUDA)
register those addresses; backends whose memory is a handle (OpenCL ``cl_mem``, wgpu
buffers) take synthetic, never-reused addresses from an :class:`AddressSpace` and keep
the handle as the allocation's payload. The table remembers a bounded number of freed
ranges, so a stale pointer is reported as freed rather than unknown. The records
(:class:`Allocation`, :class:`Region`, ...) live in :mod:`computehal._allocations`.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from threading import get_ident
from types import TracebackType

from ._allocations import ALIGNMENT, AddressSpace, Allocation, AllocationInfo, Region
from ._args import ADDRESS_END, MAX_COUNT, as_count, as_int, as_pointer, ceil_div
from .errors import InvalidArgumentError, NotInitializedError

__all__ = [
    "ALIGNMENT",
    "Allocation",
    "AllocationInfo",
    "Region",
    "Lease",
    "PointerTable",
    "AddressSpace",
    "as_pointer",
    "as_count",
    "as_int",
    "ceil_div",
    "MAX_COUNT",
    "ADDRESS_END",
]

#: Serials of allocations, unique in the process (caches of derived data key by them).
_SERIALS = itertools.count(1)


class Lease:
    """The operands of one operation, pinned from resolution until the lease ends.

    Use as a context manager (``with table.lease() as lease: region = lease.resolve(...)``)
    or call :meth:`end` exactly once. Leases are cheap (one per call) and belong to one
    thread. A lease counts as a running operation (for :meth:`PointerTable.close`) from
    its first pin: until then it has touched nothing. Each resolution takes the table's
    lock once, and so does the end of a lease that pinned something.
    """

    __slots__ = ("_table", "_pinned", "_owner")

    def __init__(self, table: PointerTable) -> None:
        self._table = table
        self._pinned: list[Allocation] = []
        self._owner: int  # the thread's id, set at the first pin (see _RUNNING)

    def resolve(self, name: str, ptr: object, nbytes: int, align: int = 1) -> Region:
        """Check and pin ``nbytes`` bytes at ``ptr``; see :meth:`PointerTable.resolve`.

        Raises
        ------
        NotInitializedError
            If the table has been closed.
        """
        address = ptr if type(ptr) is int and 0 < ptr < ADDRESS_END else as_pointer(name, ptr)
        if address % align:
            raise _misaligned(name, address, align)
        table = self._table
        lock = table._lock
        lock.acquire()  # acquire / release: a third of what a ``with`` block costs
        try:
            if table._closed:
                raise NotInitializedError()
            allocation = table._by_base.get(address)  # operands are most often base pointers
            if allocation is None:
                allocation = table._find(address)
                if allocation is None:
                    raise table._missing(name, address)
            offset = address - allocation.base
            if nbytes > allocation.size - offset:
                raise _too_short(name, address, nbytes, allocation)
            pinned = self._pinned  # as in _hold, written out
            if not pinned:
                table._leases += 1
                self._owner = owner = get_ident()
                _RUNNING.append(owner)
            allocation.pins += 1
            pinned.append(allocation)
        finally:
            lock.release()
        whole = allocation.whole  # operands are most often whole allocations
        if whole is not None and not offset and nbytes == allocation.size:
            return whole
        return _whole_or_region(allocation, offset, nbytes)

    def resolve_pair(
        self, name_a: str, ptr_a: object, name_b: str, ptr_b: object, nbytes: int, align: int = 1
    ) -> tuple[Region, Region]:
        """:meth:`resolve` of two operands of ``nbytes`` each, as ``resolve(a)`` then ``resolve(b)``.

        The common case (plain aligned ints inside live allocations, long enough) takes
        the table's lock once; anything else goes through :meth:`resolve` one operand
        after the other, with its errors.
        """
        if type(ptr_a) is int and type(ptr_b) is int and not (ptr_a % align or ptr_b % align):
            table = self._table
            lock = table._lock
            lock.acquire()
            try:
                by_base = table._by_base
                first = by_base.get(ptr_a) or table._find(ptr_a)
                second = by_base.get(ptr_b) or table._find(ptr_b)
                if first is not None and second is not None and not table._closed:
                    offset_a = ptr_a - first.base
                    offset_b = ptr_b - second.base
                    if nbytes <= first.size - offset_a and nbytes <= second.size - offset_b:
                        pinned = self._pinned
                        if not pinned:
                            table._leases += 1
                            self._owner = owner = get_ident()
                            _RUNNING.append(owner)
                        first.pins += 1
                        second.pins += 1
                        pinned.append(first)
                        pinned.append(second)
                        region_a = first.whole  # operands are most often whole allocations
                        if region_a is None or offset_a or nbytes != first.size:
                            region_a = _whole_or_region(first, offset_a, nbytes)
                        region_b = second.whole
                        if region_b is None or offset_b or nbytes != second.size:
                            region_b = _whole_or_region(second, offset_b, nbytes)
                        return region_a, region_b
            finally:
                lock.release()
        return self.resolve(name_a, ptr_a, nbytes, align), self.resolve(name_b, ptr_b, nbytes, align)

    def pin(self, allocation: Allocation) -> None:
        """Pin an allocation found otherwise (a backend's scratch, say) until the lease ends."""
        with self._table._lock:
            if self._table._closed:
                raise NotInitializedError()
            self._hold(allocation)

    def _hold(self, allocation: Allocation) -> None:
        # Under the table's lock. The first pin makes the lease a running operation.
        pinned = self._pinned
        if not pinned:
            self._table._leases += 1
            self._owner = owner = get_ident()
            _RUNNING.append(owner)
        allocation.pins += 1
        pinned.append(allocation)

    def end(self) -> None:
        """Unpin every operand; release those freed meanwhile (once the last lease on them ends)."""
        pinned = self._pinned
        if not pinned:
            return
        table = self._table
        due: list[Allocation] | None = None
        callbacks: Sequence[Callable[[], None]] = ()
        lock = table._lock
        lock.acquire()
        try:
            for allocation in pinned:
                allocation.pins -= 1
                if allocation.freed and allocation.pins == 0:
                    due = [allocation] if due is None else [*due, allocation]
            pinned.clear()
            table._leases -= 1
            _RUNNING.remove(self._owner)
            if table._leases == 0 and (table._waiting or table._on_idle):
                callbacks, table._on_idle = table._on_idle, []
                table._idle.notify_all()
        finally:
            lock.release()
        if due is not None:
            table._released(due)
        for callback in callbacks:
            callback()

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end()


#: ``Region`` without the named tuple's Python-level ``__new__`` (one per operand per call).
_region = tuple.__new__


def _whole_or_region(allocation: Allocation, offset: int, nbytes: int) -> Region:
    """A new region, or the allocation's whole region (made once and kept in ``whole``)."""
    region: Region = _region(Region, (allocation, offset, nbytes))
    if not offset and nbytes == allocation.size:
        allocation.whole = region
    return region


def _misaligned(name: str, address: int, align: int) -> InvalidArgumentError:
    return InvalidArgumentError(f"{name} = {address:#x} is not aligned to its {align}-byte elements")


def _too_short(name: str, address: int, nbytes: int, allocation: Allocation) -> InvalidArgumentError:
    available = allocation.end - address
    return InvalidArgumentError(
        f"{name} = {address:#x} needs {nbytes} bytes but only {available} remain in "
        f"its allocation ({allocation.size} bytes at {allocation.base:#x})"
    )


class PointerTable:
    """Thread-safe table of live allocations, keyed by base address.

    Parameters
    ----------
    release : callable, optional
        Called with each owned (not borrowed) allocation once it is freed and no
        operation pins it any more; it returns the memory to the device. It is never
        called while the table's lock is held.
    remember : int
        How many freed ranges are remembered for error messages ("was freed").

    Lookups of interior pointers bisect the sorted list of bases, so each operand
    check costs O(log n) in the number of live allocations.
    """

    def __init__(self, release: Callable[[Allocation], None] | None = None, remember: int = 4096) -> None:
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._bases: list[int] = []
        self._by_base: dict[int, Allocation] = {}
        self._freed: OrderedDict[int, int] = OrderedDict()
        self._remember = remember
        self._release = release
        self._leases = 0
        self._waiting = 0
        self._last: Allocation | None = None
        self._closed = False
        self._on_idle: list[Callable[[], None]] = []

    # ---------------------------------------------------------------- registration

    def insert(self, allocation: Allocation) -> None:
        """Register ``allocation`` (giving it a fresh serial); it must not overlap a live one."""
        with self._lock:
            i = bisect.bisect_right(self._bases, allocation.base)
            if i > 0 and self._by_base[self._bases[i - 1]].end > allocation.base:
                raise InvalidArgumentError(f"range at {allocation.base:#x} overlaps a live allocation")
            if i < len(self._bases) and self._bases[i] < allocation.end:
                raise InvalidArgumentError(f"range at {allocation.base:#x} overlaps a live allocation")
            allocation.serial = next(_SERIALS)
            allocation.freed = False
            self._bases.insert(i, allocation.base)
            self._by_base[allocation.base] = allocation
            self._freed.pop(allocation.base, None)

    def remove(self, name: str, ptr: object) -> Allocation:
        """Unregister the allocation whose base is ``ptr`` and mark it freed; return it.

        The caller decides what happens to the memory; :meth:`free` is the usual path.

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
                if address in self._freed:
                    raise InvalidArgumentError(f"{name} = {address:#x} was already freed (double free)")
                raise InvalidArgumentError(
                    f"{name} = {address:#x} is not a live allocation (never allocated or already freed)"
                )
            self._bases.pop(bisect.bisect_left(self._bases, address))
            self._forget(allocation)
            return allocation

    def free(self, name: str, ptr: object) -> None:
        """Unregister ``ptr`` now; release its memory now, or when the last operation using it ends."""
        allocation = self.remove(name, ptr)
        with self._lock:
            due = allocation.pins == 0
        if due:
            self._released([allocation])

    def _forget(self, allocation: Allocation) -> None:
        # Under the lock: mark freed and remember the range for "was freed" messages.
        allocation.freed = True
        self._freed[allocation.base] = allocation.size
        while len(self._freed) > self._remember:
            self._freed.popitem(last=False)

    def _released(self, allocations: list[Allocation]) -> None:
        # No operation pins these any more: drop the cached view before the memory, and
        # the whole region (a reference cycle) with it.
        for allocation in allocations:
            allocation.view = None
            allocation.whole = None
        if self._release is None:
            return
        for allocation in allocations:
            if not allocation.borrowed:
                self._release(allocation)

    # ---------------------------------------------------------------- lookups

    def _find(self, address: int) -> Allocation | None:
        last = self._last  # calls often reuse the allocation of the previous lookup
        if last is not None and last.base <= address <= last.base + last.size and not last.freed:
            return last
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0:
            return None
        allocation = self._by_base[self._bases[i]]
        if address <= allocation.end:
            self._last = allocation
            return allocation
        return None

    def _missing(self, name: str, address: int) -> InvalidArgumentError:
        # Under the lock.
        for base, size in reversed(self._freed.items()):
            if base <= address <= base + size:
                return InvalidArgumentError(
                    f"{name} = {address:#x} points into an allocation that was freed "
                    f"({size} bytes at {base:#x})"
                )
        return InvalidArgumentError(
            f"{name} = {address:#x} does not point into any live allocation of this backend"
        )

    def resolve(self, name: str, ptr: object, nbytes: int, align: int = 1) -> Region:
        """Check that ``nbytes`` bytes at ``ptr`` lie inside one live allocation (no pin).

        A zero-byte range only needs ``ptr`` to point into (or one past the end of)
        a live allocation. ``align`` is the required alignment of ``ptr`` (the element
        size for typed operands: every device, and BLAS, needs naturally aligned data).
        Operations resolve through a :meth:`lease` instead, which also pins.

        Raises
        ------
        InvalidArgumentError
            Naming the argument, the pointer in hex, and the bytes needed vs available.
        """
        address = ptr if type(ptr) is int and 0 < ptr < ADDRESS_END else as_pointer(name, ptr)
        if address % align:
            raise _misaligned(name, address, align)
        with self._lock:
            allocation = self._find(address)
            if allocation is None:
                raise self._missing(name, address)
            if nbytes > allocation.end - address:
                raise _too_short(name, address, nbytes, allocation)
        return Region(allocation, address - allocation.base, nbytes)

    def freeze(self, name: str, ptr: object) -> None:
        """Make the live allocation holding ``ptr`` read-only to every later operation.

        Idempotent. Raises
        ------
        InvalidArgumentError
            If ``ptr`` points into no live allocation, into borrowed memory (its owner
            writes it behind the table), into one of which a writable host view was
            handed out, or into one a running operation is using (it might be writing
            it: data derived from it afterwards could go stale).
        """
        address = as_pointer(name, ptr)
        with self._lock:
            allocation = self._by_base.get(address) or self._find(address)
            if allocation is None or address == allocation.end:
                raise self._missing(name, address)
            if allocation.borrowed:
                raise InvalidArgumentError(f"{name} = {address:#x} is borrowed: its owner writes it")
            if allocation.exposed:
                raise InvalidArgumentError(
                    f"{name} = {address:#x}: a writable host view of its allocation was handed out"
                )
            if allocation.pins and not allocation.frozen:
                raise InvalidArgumentError(f"{name} = {address:#x}: a running operation uses its allocation")
            allocation.frozen = True

    def expose(self, region: Region) -> bool:
        """Record that ``region``'s memory is handed out as a host view; False: it must be read-only.

        A frozen allocation gives read-only views; any other is marked exposed, and can
        then no longer be frozen (a view cannot be taken back).
        """
        allocation = region.allocation
        with self._lock:
            if allocation.frozen:
                return False
            allocation.exposed = True
            return True

    def info(self, ptr: object) -> AllocationInfo | None:
        """The live allocation holding ``ptr`` (base .. end inclusive), or None."""
        address = as_pointer("ptr", ptr)
        with self._lock:
            allocation = self._find(address)
            if allocation is None:
                return None
            return AllocationInfo(allocation.base, allocation.size, allocation.borrowed, allocation.serial)

    # ---------------------------------------------------------------- leases

    def lease(self) -> Lease:
        """A new :class:`Lease` for one operation.

        Raises
        ------
        NotInitializedError
            If the table has been closed (the backend was closed).
        """
        if self._closed:
            raise NotInitializedError()
        return Lease(self)

    def busy(self) -> bool:
        """True while an operation holds a lease that pinned something."""
        with self._lock:
            return self._leases > 0

    # ---------------------------------------------------------------- whole table

    def live(self) -> list[Allocation]:
        """A snapshot of the live allocations, in address order."""
        with self._lock:
            return [self._by_base[b] for b in self._bases]

    def __len__(self) -> int:
        with self._lock:
            return len(self._bases)

    def drain(self) -> list[Allocation]:
        """Unregister every live allocation; release those no operation pins, now.

        Returns every allocation that was live. Pinned ones are released when their
        last operation ends. Safe against re-entry (a garbage-collector finaliser
        freeing an array while the table drains finds it already gone).
        """
        with self._lock:
            fresh_bases: list[int] = []
            fresh_map: dict[int, Allocation] = {}
            old_bases, old_map = self._bases, self._by_base
            self._bases, self._by_base = fresh_bases, fresh_map
            allocations = [old_map[b] for b in old_bases]
            due = []
            for allocation in allocations:
                self._forget(allocation)
                if allocation.pins == 0:
                    due.append(allocation)
        self._released(due)
        return allocations

    def close(self, shutdown: Callable[[], None] | None = None) -> None:
        """Refuse new leases, drain, and run ``shutdown`` once no operation is running.

        Called from another thread, this waits for running operations to end. Called
        from inside an operation (a hostile ``__index__``, a callback), it cannot wait:
        ``shutdown`` then runs when that operation's lease ends.
        """
        with self._lock:
            self._closed = True
        self.drain()
        if shutdown is None:
            return
        with self._lock:
            if self._leases and _holds_lease_here():
                self._on_idle.append(shutdown)
                return
            self._waiting += 1
            try:
                while self._leases:
                    self._idle.wait()
            finally:
                self._waiting -= 1
        shutdown()

    def reopen(self) -> None:
        """Accept leases again (the backend was initialised after a close)."""
        with self._lock:
            self._closed = False

    @property
    def closed(self) -> bool:
        """True after :meth:`close` until :meth:`reopen`."""
        return self._closed


#: The thread ids of the running operations (of every table): one entry per lease that
#: pinned something, added and removed by that lease's thread.
_RUNNING: list[int] = []


def _holds_lease_here() -> bool:
    """True when the calling thread is inside an operation of some backend."""
    return get_ident() in _RUNNING

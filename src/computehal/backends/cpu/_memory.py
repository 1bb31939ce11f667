"""Host memory for the CPU backend: aligned blocks, a quarantine of freed ones, a budget.

Small blocks are NumPy byte arrays (``malloc``); large ones are private anonymous
``mmap`` mappings of their own (from :data:`HUGE_BYTES`, on 2 MiB boundaries, with
transparent huge pages requested). A freed block is not returned to the system at once: it waits
in a bounded quarantine (as address sanitizers do), so that ``alloc`` does not hand the
same address out again while a stale pointer may still name it, and the stale pointer
is reported as freed instead of silently aliasing new memory. Small blocks wait whole
(up to :data:`SMALL_BLOCKS` blocks and :data:`SMALL_BYTES` bytes); a large block gives
its pages back at once (``MADV_DONTNEED``) and only its address range waits (up to
:data:`LARGE_BLOCKS` ranges). The oldest blocks leave first.

Every block held (live or waiting whole) counts against the process-wide budget that
:func:`memory_limit` reports: physical memory minus what computehal holds, and at most
what the OS says is available, so an allocation that cannot be backed fails up front
with :class:`~computehal.OutOfMemoryError` rather than later, when the kernel kills the
process for touching it.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import OutOfMemoryError
from ...memory import ALIGNMENT
from ._runtime import memory_available, memory_total

__all__ = [
    "LARGE_BLOCKS",
    "LARGE_THRESHOLD",
    "SMALL_BLOCKS",
    "SMALL_BYTES",
    "HostHeap",
    "borrowed_bytes",
    "memory_limit",
]

#: Blocks of at least this many bytes get an ``mmap`` of their own.
LARGE_THRESHOLD = 1 << 18
#: Most small freed blocks held back, and most bytes they may hold.
SMALL_BLOCKS = 4096
SMALL_BYTES = 64 << 20
#: Most large freed address ranges held back (their pages are returned at once).
LARGE_BLOCKS = 1024
#: Blocks of at least this many bytes (one huge page) start on a :data:`HUGE_PAGE`
#: boundary and ask for transparent huge pages: a kernel walking a large matrix down its
#: columns (softmax or a reduction over axis 0, a transpose) touches a new 4 KiB page on
#: every row, and the TLB misses cost 5-15 % of a column softmax's time (4096 x 4096
#: float32, measured). Reading a block cold pays a page walk per 4 KiB page too: global
#: average pooling of a 3.2 MB input right after a 128 MB copy, one process, alternating,
#: took 308-315 us (median) from huge pages against 343-366 us from 4 KiB pages (the
#: threshold was 4 MiB before). A block's tail past its last whole huge page gets one
#: where the mapping's alignment slack covers it, else 4 KiB pages.
HUGE_PAGE = 2 << 20
HUGE_BYTES = HUGE_PAGE
#: Private anonymous mappings where the platform has them: ``MADV_DONTNEED`` then really
#: returns the pages (a shared anonymous mapping keeps them), and Linux backs them with
#: transparent huge pages (it does not for shared memory by default).
_PRIVATE: int | None = (
    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")
    else None
)

Bytes = npt.NDArray[np.uint8]

#: How long a reading of the OS's available memory is trusted (allocation is frequent).
AVAILABLE_TTL = 0.05


class _Budget:
    """Bytes of physical memory held by every :class:`HostHeap` of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = 0
        self._reading: tuple[float, int | None, int] = (-1.0, None, 0)  # (time, available, held then)

    def add(self, delta: int) -> None:
        with self._lock:
            self.held += delta

    def limit(self) -> int | None:
        total = memory_total()
        if not total:
            return None
        now = time.monotonic()
        with self._lock:
            stamp, available, held_then = self._reading
            held = self.held
        if now - stamp >= AVAILABLE_TTL:
            available, held_then = memory_available(), held
            with self._lock:
                self._reading = (now, available, held_then)
        limit = total - held
        if available is not None:
            # The OS figure does not see blocks allocated (and not yet touched) since it was read.
            limit = min(limit, available - max(0, held - held_then))
        return max(0, limit)


_BUDGET = _Budget()


def memory_limit() -> int | None:
    """The largest allocation that can be backed now (bytes), or None when unknown.

    Physical memory minus what every CPU backend of the process holds (allocated, even
    if never touched, plus small freed blocks in quarantine), and at most what the OS
    reports as available.
    """
    return _BUDGET.limit()


class _Block:
    """One allocation's memory: the byte array and, for large blocks, their mapping."""

    __slots__ = ("array", "mapping", "nbytes")

    def __init__(self, array: Bytes, mapping: mmap.mmap | None, nbytes: int) -> None:
        self.array = array
        self.mapping = mapping
        self.nbytes = nbytes


class HostHeap:
    """Allocates host blocks and quarantines freed ones (see the module docstring).

    Thread-safe. ``allocate`` returns ``(address, byte array)``; the byte array is the
    allocation's payload. ``release`` takes the payload back.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[int, _Block] = {}
        self._small: deque[_Block] = deque()
        self._small_bytes = 0
        self._large: deque[_Block] = deque()

    def allocate(self, nbytes: int) -> tuple[int, Bytes]:
        """A new 64-byte-aligned block of ``nbytes`` bytes (not zeroed)."""
        try:
            block = self._large_block(nbytes) if nbytes >= LARGE_THRESHOLD else self._small_block(nbytes)
        except (MemoryError, OSError, ValueError, OverflowError):
            raise OutOfMemoryError(nbytes, memory_limit()) from None
        address = int(block.array.ctypes.data)
        with self._lock:
            self._blocks[address] = block
        _BUDGET.add(nbytes)
        return address, block.array

    @staticmethod
    def _small_block(nbytes: int) -> _Block:
        raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
        shift = (-raw.ctypes.data) % ALIGNMENT
        return _Block(raw[shift : shift + nbytes], None, nbytes)

    @staticmethod
    def _large_block(nbytes: int) -> _Block:
        # One spare page: consecutive mappings are often adjacent, and a stale pointer
        # to the start of the next one must not read as "one past the end" of this one.
        huge = nbytes >= HUGE_BYTES and _PRIVATE is not None
        spare = mmap.PAGESIZE + (HUGE_PAGE if huge else 0)
        if _PRIVATE is None:
            mapping = mmap.mmap(-1, nbytes + spare)
        else:
            mapping = mmap.mmap(-1, nbytes + spare, flags=_PRIVATE)
        raw = np.frombuffer(mapping, dtype=np.uint8)
        shift = 0
        if huge:
            shift = (-raw.ctypes.data) % HUGE_PAGE
            try:
                mapping.madvise(mmap.MADV_HUGEPAGE)
            except (AttributeError, OSError, ValueError):
                pass  # no transparent huge pages here: 4 KiB pages, as before
        return _Block(raw[shift : shift + nbytes], mapping, nbytes)

    def release(self, address: int, quarantine: bool = True) -> None:
        """Take back the block at ``address``: into the quarantine, or at once (scratch)."""
        with self._lock:
            block = self._blocks.pop(address, None)
        if block is None:
            return
        if block.mapping is not None:
            self._drop_pages(block)
            _BUDGET.add(-block.nbytes)
            if quarantine:
                with self._lock:
                    self._large.append(block)
                    while len(self._large) > LARGE_BLOCKS:
                        self._large.popleft()
            return
        if not quarantine:
            _BUDGET.add(-block.nbytes)
            return
        evicted: list[_Block] = []
        with self._lock:
            self._small.append(block)
            self._small_bytes += block.nbytes
            while self._small and (len(self._small) > SMALL_BLOCKS or self._small_bytes > SMALL_BYTES):
                old = self._small.popleft()
                self._small_bytes -= old.nbytes
                evicted.append(old)
        _BUDGET.add(-sum(old.nbytes for old in evicted))

    @staticmethod
    def _drop_pages(block: _Block) -> None:
        """Give a large block's pages back to the OS; its address range stays reserved."""
        assert block.mapping is not None
        try:
            block.mapping.madvise(mmap.MADV_DONTNEED)
        except (AttributeError, OSError, ValueError):
            pass  # no madvise here: the pages stay until the mapping goes


def borrowed_bytes(address: int, nbytes: int, owner: object) -> Bytes:
    """A byte array over ``nbytes`` bytes of foreign host memory at ``address``.

    The array keeps ``owner`` alive (through the ctypes object it views).
    """
    raw: Any = (ctypes.c_ubyte * nbytes).from_address(address)
    raw.computehal_owner = owner
    return np.frombuffer(raw, dtype=np.uint8)

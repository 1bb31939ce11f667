"""The CUDA backend's device plumbing: identity, lifecycle, memory hooks, launches.

:class:`CudaCore` is the base of every op-family mixin of the package. Its device
resources live in one :class:`~._device.CudaDevice` created by ``init`` (through the
:meth:`CudaCore._connect` hook) and closed by ``close``. Pointers are real device
addresses from the device's own CuPy memory pool, so memory can be handed to CuPy,
PyTorch or anything else that speaks DLPack in place.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ...errors import DeviceError, OutOfMemoryError, UnsupportedError
from ...memory import Allocation, Region
from ...types import Capabilities, DeviceInfo
from .._base import TableBackend, guarded
from .._common import ceil_div
from ._device import GRID_YZ_MAX, CudaDevice
from ._driver import all_devices, is_hip
from ._programs import KernelSource, Ptr, cast_unit

__all__ = ["CudaCore", "I32", "I64", "KDL_CUDA", "KDL_ROCM", "Ptr", "linear", "scalar", "split_outer"]

I32 = np.int32
I64 = np.int64

#: DLPack device types of CUDA and ROCm memory.
KDL_CUDA = 2
KDL_ROCM = 10

#: Threads per block of the one-dimensional kernels.
_BLOCK = 256


def scalar(value: float, dtype: np.dtype[Any]) -> Any:
    """``value`` as a kernel argument of ``dtype`` (overflow to inf, as a C cast does)."""
    with np.errstate(over="ignore"):
        return dtype.type(value)


def linear(count: int, block: int = _BLOCK) -> tuple[tuple[int], tuple[int]]:
    """Grid and block of a kernel with one thread per item (``count`` items)."""
    return (ceil_div(count, block),), (block,)


def split_outer(
    dims: Sequence[int], sets: Sequence[Sequence[int]], limit: int = GRID_YZ_MAX
) -> Iterator[tuple[list[int], list[int]]]:
    """Pieces of a strided view whose outer index (all but the last dimension) fits ``limit``.

    Kernels of ``kernels/strided.h`` take the flat outer index from grid dimension y,
    which CUDA caps at 65535. Yields ``(piece_dims, offsets)``: dimensions of the same
    count as ``dims`` (leading ones set to 1 where the piece fixes them) and, for each
    stride list of ``sets``, the element offset of the piece's first element.
    """
    outer = list(dims[:-1])
    if math.prod(outer) <= limit:
        yield list(dims), [0] * len(sets)
        return
    axis, tail = len(outer) - 1, 1
    while axis >= 0 and tail * outer[axis] <= limit:
        tail *= outer[axis]
        axis -= 1
    step = max(1, limit // tail)
    for prefix in itertools.product(*(range(e) for e in outer[:axis])):
        for start in range(0, outer[axis], step):
            length = min(step, outer[axis] - start)
            offsets = [sum(i * s[d] for d, i in enumerate(prefix)) + start * s[axis] for s in sets]
            yield [1] * axis + [length, *outer[axis + 1 :], dims[-1]], offsets


class Quarantine:
    """Freed device blocks held back from the pool for a while (bounded by count and bytes).

    CuPy's pool hands a freed block out again at once; holding the most recent ones keeps
    their addresses unused, so a stale pointer is reported as freed instead of silently
    naming new memory (as address sanitizers do). The oldest blocks leave first; a block
    larger than a quarter of the byte budget goes back at once.
    """

    def __init__(self, blocks: int = 4096, nbytes: int = 256 << 20) -> None:
        self.blocks, self.nbytes = blocks, nbytes
        self._held: deque[tuple[Any, int]] = deque()
        self._bytes = 0
        self._lock = threading.Lock()

    def hold(self, payload: Any, nbytes: int) -> None:
        """Keep ``payload`` (a pool block) alive for a while; drop the oldest beyond the bounds."""
        if nbytes > self.nbytes // 4:
            return
        evicted = []
        with self._lock:
            self._held.append((payload, nbytes))
            self._bytes += nbytes
            while len(self._held) > self.blocks or self._bytes > self.nbytes:
                evicted.append(self._held.popleft())
                self._bytes -= evicted[-1][1]
        evicted.clear()  # the pool gets them back here, outside the lock

    def flush(self) -> bool:
        """Give every held block back to the pool; True if there was any."""
        with self._lock:
            held, self._held, self._bytes = list(self._held), deque(), 0
        return bool(held)


class _RuntimeKind:
    """``CudaBackend.kind``: ``"cuda"`` on the class; on an instance ``"rocm"`` under CuPy's HIP build."""

    def __get__(self, backend: CudaCore | None, owner: type) -> str:
        return "cuda" if backend is None else backend.name()


class CudaCore(TableBackend):
    """Device plumbing shared by the op families (see the package's ``CudaBackend``)."""

    kind = _RuntimeKind()

    def __init__(self, device: int = 0) -> None:
        super().__init__(device)
        self._info: DeviceInfo | None = None
        self._dev: CudaDevice | None = None
        self._quarantine = Quarantine()

    # ------------------------------------------------------------------ identity

    def name(self) -> str:
        return "rocm" if is_hip() else "cuda"

    def _device_record(self) -> DeviceInfo:
        """The description of this backend's device (queried once; DeviceError without one)."""
        if self._info is None:
            devices = all_devices()
            if self.device >= len(devices):
                raise DeviceError(
                    f"{self.name()} device {self.device} does not exist ({len(devices)} visible)"
                )
            self._info = devices[self.device]
        return self._info

    @guarded
    def capabilities(self) -> Capabilities:
        return self._with_dtypes(self._device_record().capabilities)

    @guarded
    def available_devices(self) -> list[DeviceInfo]:
        return all_devices()

    def dlpack_device(self) -> tuple[int, int] | None:
        """``(kDLCUDA, ordinal)``, or ``(kDLROCM, ordinal)`` under CuPy's HIP build."""
        return (KDL_ROCM if is_hip() else KDL_CUDA, self.device)

    # ------------------------------------------------------------------ lifecycle

    @property
    def _session(self) -> CudaDevice:
        """The open device session (the lease of every operation keeps it open)."""
        if self._dev is None:
            raise DeviceError(f"the {self.name()} device is not open")
        return self._dev

    def _connect(self, info: DeviceInfo) -> CudaDevice:
        """An opened device session for ``info`` (a :class:`~._device.CudaDevice`)."""
        device = CudaDevice(self.device, info)
        device.open()
        return device

    def _open(self) -> None:
        info = self._device_record()
        self._quarantine = Quarantine(nbytes=min(256 << 20, max(1 << 20, info.total_memory_bytes // 64)))
        self._dev = self._connect(info)

    def _shutdown(self) -> None:
        self._quarantine.flush()
        device, self._dev = self._dev, None
        if device is not None:
            device.close()

    @guarded
    def synchronize(self) -> None:
        self._memory()
        self._session.synchronize()

    # ------------------------------------------------------------------ memory hooks

    def _memory_limit(self) -> int | None:
        total = self._device_record().total_memory_bytes
        return total or None

    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        try:
            base, memory = self._session.allocate(nbytes)
        except OutOfMemoryError:
            if not self._quarantine.flush():
                raise
            base, memory = self._session.allocate(nbytes)
        return int(base), memory

    def _release(self, allocation: Allocation) -> None:
        # The block waits in the quarantine, then goes back to the pool; work already issued on
        # the stream is ordered before any reuse.
        payload, allocation.payload = allocation.payload, None
        self._quarantine.hold(payload, allocation.size)

    def _drop_scratch(self, scratch: Region) -> None:
        # Scratch addresses were never handed out: straight back to the pool.
        scratch.allocation.payload = None

    def _borrow_payload(self, address: int, nbytes: int, owner: object) -> Any:
        if not self._session.owns(address, nbytes):
            raise UnsupportedError(
                f"the {self.name()} backend borrows only memory of its own device {self.device}"
            )
        return owner

    def _write(self, region: Region, data: memoryview) -> None:
        self._session.write(region.ptr, np.frombuffer(data, dtype=np.uint8))

    def _read(self, region: Region, out: memoryview) -> None:
        self._session.read(np.frombuffer(out, dtype=np.uint8), region.ptr)

    def _read_words(self, ptr: int, count: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """``count`` int64 values at device address ``ptr`` (after every earlier operation)."""
        host = np.empty(count, dtype=np.int64)
        self._session.read(host.view(np.uint8), ptr)
        return host

    # ------------------------------------------------------------------ kernels

    def _launch(
        self, unit: KernelSource, function: str, grid: Sequence[int], block: Sequence[int], *args: Any
    ) -> None:
        """Launch ``function`` of ``unit``; nothing when the grid is empty."""
        if all(g > 0 for g in grid):
            self._session.launch(unit, function, grid, block, args)

    def _cast_bits(self, kernel: str, src: int, dst: int, count: int) -> None:
        """Run conversion ``kernel`` (``cast_f16_f32``, ...) on ``count`` elements, ``src`` to ``dst``."""
        grid, block = linear(count)
        self._launch(cast_unit(), kernel, grid, block, Ptr(src), I64(0), Ptr(dst), I64(0), I64(count))

"""The CPU backend's plumbing: identity, host memory hooks, and typed views of regions.

:class:`CpuPlumbing` is the base every op family of the CPU backend builds on. Its
memory is host memory: a pointer is a real address, a region is viewed in place as a
NumPy array (:meth:`CpuPlumbing._array` and friends), and other libraries may address
it directly (:meth:`host_view`, :meth:`dlpack_device`, :meth:`borrow`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import DeviceError
from ...memory import Allocation, Region, as_count
from ...types import Capabilities, DeviceInfo, MemoryKind
from .._base import TableBackend, guarded
from ._memory import HostHeap, borrowed_bytes, memory_limit
from ._runtime import cpu_name, memory_total
from ._winograd_cache import forget_frozen

__all__ = ["CpuPlumbing", "FloatArray", "KDL_CPU"]

FloatArray = npt.NDArray[np.floating[Any]]

#: DLPack's device type of host memory.
KDL_CPU = 1


class CpuPlumbing(TableBackend):
    """Host memory and identity shared by every op family of the CPU backend."""

    kind = "cpu"

    def __init__(self, device: int = 0) -> None:
        super().__init__(device)
        self._heap = HostHeap()

    # ------------------------------------------------------------------ identity

    def name(self) -> str:
        return "cpu"

    def _open(self) -> None:
        if self._device_ordinal != 0:
            raise DeviceError(
                f"the CPU backend has one device (0); device {self._device_ordinal} does not exist"
            )

    def capabilities(self) -> Capabilities:
        return self._with_dtypes(Capabilities())

    def available_devices(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(
                ordinal=0,
                name=cpu_name(),
                compute_capability=(0, 0),
                total_memory_bytes=memory_total(),
                memory_kind=MemoryKind.HOST,
                capabilities=self.capabilities(),
            )
        ]

    def synchronize(self) -> None:
        self._memory()  # everything runs synchronously; only the lifecycle is checked

    # ------------------------------------------------------------------ host memory

    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        return self._heap.allocate(nbytes)

    def _release(self, allocation: Allocation) -> None:
        # Freed memory waits in the heap's quarantine: its address is not handed out again soon.
        if allocation.frozen:
            forget_frozen(allocation.serial)
        self._heap.release(allocation.base)
        allocation.payload = None

    def _drop_scratch(self, scratch: Region) -> None:
        # Scratch addresses were never given out: no quarantine.
        scratch.allocation.view = None
        self._heap.release(scratch.allocation.base, quarantine=False)

    def _memory_limit(self) -> int | None:
        return memory_limit()

    def _borrow_payload(self, address: int, nbytes: int, owner: object) -> Any:
        return borrowed_bytes(address, nbytes, owner)

    def _write(self, region: Region, data: memoryview) -> None:
        self._bytes(region)[:] = np.frombuffer(data, dtype=np.uint8)

    def _read(self, region: Region, out: memoryview) -> None:
        np.frombuffer(out, dtype=np.uint8)[:] = self._bytes(region)

    @guarded
    def host_view(self, ptr: int, nbytes: int) -> memoryview | None:
        """A writable zero-copy view of ``nbytes`` bytes at ``ptr`` (checked like an operand).

        The view keeps the memory alive, but means nothing after :meth:`free`. Read-only
        for a frozen allocation; any other can no longer be frozen once viewed.
        """
        table = self._memory()
        region = table.resolve("ptr", ptr, as_count("nbytes", nbytes))
        view: memoryview = self._bytes(region).data
        return view if table.expose(region) else view.toreadonly()

    def dlpack_device(self) -> tuple[int, int] | None:
        """``(kDLCPU, 0)``: host memory, addressable in place."""
        return (KDL_CPU, 0)

    # ------------------------------------------------------------------ views

    @staticmethod
    def _bytes(region: Region) -> npt.NDArray[np.uint8]:
        """The bytes of ``region`` as a writable 1-D uint8 array."""
        buffer: npt.NDArray[np.uint8] = region.payload
        return buffer[region.offset : region.offset + region.nbytes]

    @staticmethod
    def _array(region: Region, shape: tuple[int, ...], dtype: np.dtype[Any]) -> FloatArray:
        """A writable C-contiguous view of ``region`` with ``shape`` (the region was validated)."""
        return np.ndarray(shape, dtype=dtype, buffer=region.payload, offset=region.offset)

    @staticmethod
    def _flat(region: Region, dtype: np.dtype[Any]) -> FloatArray:
        """``region`` as a 1-D array of ``dtype``: the allocation's cached typed view, or a slice.

        The first call for an allocation (or for another dtype) views the whole block
        with ``frombuffer`` and keeps that array in ``Allocation.view``, which the pointer
        table clears before the memory is released; later calls slice it, or return it
        as it is when the region is the whole block (a ``frombuffer`` per operand was a
        tenth of a one-element call). The array may thus be shared by every call on the
        allocation, from any thread: read and write its elements, slice or reshape it
        into new views, but never change its own attributes (``shape``, ``strides``,
        ``dtype``, ``flags``) in place. A region not aligned to ``dtype`` (never a
        validated typed operand) is viewed directly.
        """
        allocation, offset, nbytes = region
        size = dtype.itemsize
        if offset % size:
            unaligned: FloatArray = np.frombuffer(allocation.payload, dtype, nbytes // size, offset)
            return unaligned
        view: FloatArray | None = allocation.view
        if view is None or view.dtype != dtype:
            view = allocation.view = np.frombuffer(allocation.payload, dtype, allocation.size // size)
        if nbytes == view.nbytes and not offset:
            return view
        start = offset // size
        return view[start : start + nbytes // size]

    @staticmethod
    def _matrix(region: Region, rows: int, cols: int, ld: int, dtype: np.dtype[Any]) -> FloatArray:
        """A view of a column-major ``rows x cols`` matrix with leading dimension ``ld``."""
        size = dtype.itemsize
        return np.ndarray(
            (rows, cols), dtype=dtype, buffer=region.payload, offset=region.offset, strides=(size, ld * size)
        )

"""The OpenCL backend's device plumbing: selection, context and queue, memory, kernels.

:class:`OpenCLCore` is the base of every op-family mixin of the package; it owns the
context, the in-order queue, the bounded :class:`~._runtime.ProgramCache`, the launch
lock and reusable scratch buffers. Memory is one ``pyopencl.Buffer`` per allocation
behind synthetic 64-byte-aligned addresses (:class:`~computehal.memory.AddressSpace`);
an interior pointer resolves to (buffer, byte offset) through the shared pointer table,
and kernels receive element offsets as arguments (no sub-buffers, which carry device
alignment rules).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from ...backend import ALL_OPS
from ...errors import BackendError, DeviceError, InvalidArgumentError, OutOfMemoryError
from ...memory import AddressSpace, Allocation, Region
from ...types import Capabilities, DeviceInfo
from .._base import TableBackend, guarded
from .._common import round_up
from ._device import (
    KERNEL_PROFILES,
    DeviceFilter,
    capabilities_of,
    device_attr,
    device_info,
    has_fp64,
    list_devices,
    profile_of,
)
from ._runtime import Operand, ProgramCache, check, launch, new_buffer, real_defines, vector_bits

__all__ = ["OpenCLCore"]

#: Work-group size of the row reductions (a power of two).
_REDUCE_LS = 64
#: Work-group size of the GPU profile's row reductions over rows of at least _WIDE_ROW elements.
_REDUCE_LS_WIDE = 256
_WIDE_ROW = 4096
#: Elements per element-wise work-item on the CPU profile (EW in elementwise.cl).
_EW_CPU = 16
#: Most compiled programs kept per backend (least recently used ones are dropped).
PROGRAM_CACHE_CAPACITY = 48


def _check_filter(device_filter: object) -> DeviceFilter:
    if device_filter is None or isinstance(device_filter, str) or callable(device_filter):
        return device_filter
    raise InvalidArgumentError(
        f"device_filter must be a string, a callable or None, got {type(device_filter).__name__}"
    )


class OpenCLCore(TableBackend):
    """Device plumbing shared by the op families (see the package's :class:`OpenCLBackend`)."""

    kind = "opencl"

    def __init__(
        self,
        device: int = 0,
        *,
        platform: str | None = None,
        device_filter: str | Any | None = None,
        kernel_profile: str | None = None,
    ) -> None:
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise InvalidArgumentError(f"device must be a non-negative integer ordinal, got {device!r}")
        super().__init__(device)
        if kernel_profile is not None and kernel_profile not in KERNEL_PROFILES:
            raise InvalidArgumentError(
                f"kernel_profile must be one of {KERNEL_PROFILES} or None, got {kernel_profile!r}"
            )
        if platform is not None and not isinstance(platform, str):
            raise InvalidArgumentError(f"platform must be a string or None, got {type(platform).__name__}")
        self._requested_profile = kernel_profile
        self._profile = kernel_profile or "cpu"
        self._ordinal = device
        self._platform_filter = platform
        self._device_filter = _check_filter(device_filter)
        self._device: Any = None
        self._context: Any = None
        self._queue: Any = None
        self._programs: ProgramCache | None = None
        self._addresses = AddressSpace()
        self._scratch: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._caps: Capabilities | None = None
        self.vector_attention = False
        self._max_alloc = 1 << 62
        self._total = 1 << 62
        self._in_use = 0
        self._max_wg = 1
        self._local_mem = 0
        self._compute_units = 1

    # ------------------------------------------------------------------ identity

    def name(self) -> str:
        return "opencl"

    def _devices(self) -> list[Any]:
        try:
            return list_devices(self._platform_filter, self._device_filter)
        except BackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - a caller's filter may raise anything
            raise DeviceError(f"listing OpenCL devices failed: {type(exc).__name__}: {exc}") from exc

    def _selected(self) -> Any:
        if self._device is not None:
            return self._device
        devices = self._devices()
        if self._ordinal >= len(devices):
            raise DeviceError(
                f"OpenCL device {self._ordinal} does not exist ({len(devices)} device(s) match"
                + (f" platform={self._platform_filter!r}" if self._platform_filter else "")
                + (f" device_filter={self._device_filter!r}" if self._device_filter else "")
                + ")"
            )
        return devices[self._ordinal]

    def capabilities(self) -> Capabilities:
        if self._caps is None:
            try:
                self._caps = self._with_dtypes(capabilities_of(self._selected()))
            except (DeviceError, cl.Error):
                return Capabilities(supports_fp64=False, native_ops=frozenset(ALL_OPS))
        return self._caps

    def _fp64(self) -> bool:
        try:
            return has_fp64(self._selected())
        except (DeviceError, cl.Error):
            return False

    def _dtype_note(self, dtype: str) -> str:
        if dtype == "float64" and not self._fp64():
            return ": the OpenCL device has no double precision (cl_khr_fp64)"
        return ""

    @guarded
    def available_devices(self) -> list[DeviceInfo]:
        infos = []
        for ordinal, dev in enumerate(self._devices()):
            try:
                infos.append(device_info(ordinal, dev))
            except cl.Error:
                continue
        return infos

    @guarded
    def device_name(self) -> str:
        """Name of the device this backend uses (or will use after ``init``)."""
        return str(self._selected().name).strip()

    @property
    def kernel_profile(self) -> str:
        """The kernel profile in use, ``"gpu"`` or ``"cpu"`` (decided by the device at ``init``
        unless the constructor forced one)."""
        return self._profile

    @property
    def program_builds(self) -> int:
        """How many OpenCL programs this backend has built since ``init``."""
        return 0 if self._programs is None else self._programs.builds

    @property
    def programs_cached(self) -> int:
        """How many compiled programs are held now (at most the cache's capacity)."""
        return 0 if self._programs is None else len(self._programs)

    # ------------------------------------------------------------------ lifecycle

    def _open(self) -> None:
        dev = self._selected()
        with check(f"opening OpenCL device {str(dev.name).strip()!r}"):
            self._context = cl.Context([dev])
            self._queue = cl.CommandQueue(self._context, dev)
        self._device = dev
        self._programs = ProgramCache(self._context, PROGRAM_CACHE_CAPACITY)
        self._caps = self._with_dtypes(capabilities_of(dev))
        self._compute_units = max(1, int(dev.max_compute_units))
        self._max_alloc = int(dev.max_mem_alloc_size)
        self._total = int(dev.global_mem_size)
        self._in_use = 0
        self._max_wg = int(dev.max_work_group_size)
        self._local_mem = int(dev.local_mem_size)
        self._max_item_sizes = list(device_attr(dev, "max_work_item_sizes") or [self._max_wg] * 3)
        self._profile = self._requested_profile or profile_of(dev)
        cpu = self._profile == "cpu"
        #: The CPU profile folds contiguous slabs per work-item (vector code); the GPU one interleaves.
        self._contig = int(cpu)
        #: Elements per element-wise work-item: a vectorisable run on CPUs, one on GPUs.
        self._ew = _EW_CPU if cpu else 1
        #: Widest vectors the kernels may hand to vector builtins (:func:`vector_bits`).
        self._vector_bits = vector_bits(self._context)
        #: The CPU profile runs attention with the single-work-item vector kernel; the GPU one
        #: with the work-group kernel (both are exercised by the tests on PoCL).
        self.vector_attention = cpu
        #: Work-group size of the row folds. On the CPU profile a work-group runs on one core, so a
        #: row per work-item (folding 16 lanes) is fastest: more work-items only add barriers.
        self._reduce_ls = 1 if cpu else self._pow2_group(_REDUCE_LS)
        self._reduce_ls_wide = 1 if cpu else self._pow2_group(_REDUCE_LS_WIDE)
        self._configure()

    def _configure(self) -> None:
        """Hook for op families to size their launches once the device is open."""

    def _pow2_group(self, wanted: int) -> int:
        """The largest power of two <= ``wanted`` that the device accepts as a work-group size."""
        return 1 << (min(wanted, self._max_wg).bit_length() - 1)

    def _shutdown(self) -> None:
        with self._lock:
            if self._queue is not None:
                with check("finishing the queue"):
                    self._queue.finish()
            self._scratch.clear()
            if self._programs is not None:
                self._programs.clear()

    @guarded
    def synchronize(self) -> None:
        self._memory()
        with self._lock, check("finishing the queue"):
            self._queue.finish()

    # ------------------------------------------------------------------ memory

    def _memory_limit(self) -> int | None:
        """The largest allocation possible now: one buffer's limit, and the device's memory less
        what this backend holds (so a request beyond the memory fails up front, not when used)."""
        return max(0, min(self._max_alloc, self._total - self._in_use))

    def _new_buffer(self, nbytes: int) -> Any:
        return new_buffer(self._context, nbytes, self._max_alloc)

    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        with self._lock:
            if nbytes > self._total - self._in_use:
                raise OutOfMemoryError(nbytes, max(0, self._total - self._in_use))
            buffer = self._new_buffer(nbytes)
            self._in_use += nbytes
        return self._addresses.reserve(nbytes), buffer

    def _release(self, allocation: Allocation) -> None:
        # OpenCL keeps a released buffer alive until the commands using it complete.
        buffer = allocation.payload
        allocation.payload = None
        if buffer is not None:
            with self._lock:
                self._in_use -= allocation.size
            with check("releasing a buffer"):
                buffer.release()

    def _write(self, region: Region, data: memoryview) -> None:
        with self._lock, check("copying to the device", region.nbytes):
            cl.enqueue_copy(self._queue, region.payload, data, dst_offset=region.offset, is_blocking=True)

    def _read(self, region: Region, out: memoryview) -> None:
        host = np.frombuffer(out, dtype=np.uint8)
        with self._lock, check("copying from the device", region.nbytes):
            cl.enqueue_copy(self._queue, host, region.payload, src_offset=region.offset, is_blocking=True)

    def _scratch_buffer(self, slot: str, nbytes: int) -> Any:
        """A device scratch buffer of at least ``nbytes`` bytes, reused across calls.

        The queue is in order, so a later operation reusing the buffer runs after every
        kernel of an earlier one that read or wrote it. Hold the launch lock.
        """
        nbytes = max(nbytes, 64)
        buffer = self._scratch.get(slot)
        if buffer is None or buffer.size < nbytes:
            self._scratch.pop(slot, None)
            buffer = self._new_buffer(round_up(nbytes, 1 << 16))
            self._scratch[slot] = buffer
        return buffer

    @staticmethod
    def _at(region: Region, itemsize: int = 4) -> Operand:
        """The buffer of ``region`` and its start in elements of ``itemsize`` bytes."""
        return Operand(region.payload, region.offset // itemsize)

    # ------------------------------------------------------------------ kernels

    def _kernel(self, source: str, name: str, dtype: np.dtype[Any] | None = None, **defines: Any) -> Any:
        """Kernel ``name`` of kernel file ``source``, built for ``dtype`` with ``defines``."""
        assert self._programs is not None
        if dtype is not None:
            defines.update(real_defines(dtype))
        return self._programs.kernel(source, name, defines)

    def _launch(
        self, kernel: Any, global_size: Sequence[int], local_size: Sequence[int] | None, *args: Any
    ) -> None:
        launch(self._queue, kernel, global_size, local_size, *args)

    def _lanes(self, dtype: np.dtype[Any]) -> int:
        """Lanes of the CPU profile's vectors of ``dtype`` (2 to 16): 128 to 512 bits of them."""
        return max(2, min(16, self._vector_bits // (8 * dtype.itemsize)))

    def _ew_defines(self, dtype: np.dtype[Any]) -> dict[str, object]:
        """Build defines of the element-wise kernels: EW, and VL lanes where EW runs as vectors."""
        return {"EW": self._ew, "VL": self._lanes(dtype)} if self._ew == _EW_CPU else {"EW": self._ew}

    def _run(self) -> int:
        """Elements one work-item walks along the inner dimension of a strided view."""
        return 16 * self._ew if self._profile == "cpu" else 1

    def _strided_local(self) -> tuple[int, int]:
        """Work-group of the strided kernels (grid: runs of the inner dimension x outer index)."""
        return (min(64, self._max_wg), 1) if self._profile == "gpu" else (1, 1)

    def _rows_ls(self, length: int) -> int:
        """Work-group size of a row reduction over rows of ``length`` elements."""
        return self._reduce_ls_wide if length >= _WIDE_ROW else self._reduce_ls

    def _native_float(self) -> frozenset[str]:
        """The float dtypes this device computes natively: float32, and float64 with cl_khr_fp64."""
        return frozenset({"float32", "float64"}) if self._fp64() else frozenset({"float32"})

    def _native_dtypes(self) -> Mapping[str, frozenset[str]]:
        return {}

"""DLPack interop: zero-copy exchange of host memory with NumPy, PyTorch, JAX, CuPy.

Export (``DeviceArray.__dlpack__``)
    * CPU backend: zero-copy. The array's memory is host memory held by a NumPy byte
      buffer, so the export is a NumPy view of the allocation; the capsule keeps that
      buffer alive even after the array (or the backend) has released it.
    * Backends whose memory is a handle (OpenCL ``cl_mem``, wgpu buffers): export by
      copy only. ``__dlpack_device__`` reports ``(kDLCPU, 0)`` (the device the exported
      data lands on), ``__dlpack__`` copies the data to the host, and ``copy=False``
      raises :class:`BufferError` as the DLPack / array-API standard requires when a
      copy would be needed.
    * CUDA / ROCm backends (through CuPy): ``__dlpack_device__`` reports
      ``(kDLCUDA, ordinal)`` / ``(kDLROCM, ordinal)`` and the export is zero-copy: a
      CuPy array over the allocation (keeping its memory block alive) exports itself,
      honouring the consumer's ``stream``. Arrays also offer
      ``__cuda_array_interface__`` (version 3). ``dl_device=(kDLCPU, 0)`` gives a host copy.

Import (:func:`from_dlpack`)
    On the CPU backend, host memory that is writable, C-contiguous and aligned to its
    element size is *borrowed*: it is registered in the backend's pointer table as a
    borrowed range (the backend never frees it; releasing the array only unregisters
    it) and kept alive by the array. On the CUDA backend, device memory of the same
    device is borrowed the same way (through ``cupy.from_dlpack``). Memory that already
    belongs to a live allocation of the same backend (an array exported and imported
    again) becomes a view of that allocation. Everything else is copied; ``copy=False``
    then raises :class:`BufferError`.
"""

from __future__ import annotations

import enum
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .backend import ComputeBackend
from .errors import BackendError, InvalidArgumentError, UnsupportedError
from .memory import Allocation

if TYPE_CHECKING:
    from .array import DeviceArray
    from .backends._base import TableBackend

__all__ = ["DLDeviceType", "from_dlpack", "dlpack_device_of", "host_backend", "host_bytes"]


class DLDeviceType(enum.IntEnum):
    """The ``DLDeviceType`` codes of the DLPack standard used by computehal."""

    CPU = 1
    CUDA = 2
    CUDA_HOST = 3
    OPENCL = 4
    VULKAN = 7
    METAL = 8
    ROCM = 10
    CUDA_MANAGED = 13
    WEBGPU = 15


#: Device types whose memory NumPy (and this module) can address from the host.
HOST_DEVICE_TYPES = frozenset({DLDeviceType.CPU, DLDeviceType.CUDA_HOST, DLDeviceType.CUDA_MANAGED})


def unwrap(backend: ComputeBackend) -> ComputeBackend:
    """The innermost backend behind any chain of ``ForwardingBackend`` wrappers."""
    seen = 0
    inner = backend
    while seen < 64:
        nxt = inner.__dict__.get("inner") if hasattr(inner, "__dict__") else None
        if not isinstance(nxt, ComputeBackend):
            return inner
        inner = nxt
        seen += 1
    return inner


def host_backend(backend: ComputeBackend) -> TableBackend | None:
    """The CPU backend behind ``backend`` when its pointers are host memory, else ``None``.

    Only the CPU backend's allocations are NumPy byte buffers that can be viewed and
    exported without a copy.
    """
    cpu = sys.modules.get("computehal.backends.cpu")
    inner = unwrap(backend)
    if cpu is not None and isinstance(inner, cpu.CpuBackend):
        return inner  # type: ignore[no-any-return]
    return None


def is_cuda_like(backend: ComputeBackend) -> bool:
    """True for backends whose pointers are CUDA / ROCm device addresses."""
    inner = unwrap(backend)
    module = type(inner).__module__
    return module.startswith("computehal.backends.cuda") or inner.name() in ("cuda", "rocm")


def backend_ordinal(backend: ComputeBackend) -> int:
    """The device ordinal a backend runs on (its ``device`` or ``ordinal`` attribute, else 0)."""
    inner = unwrap(backend)
    for attribute in ("device", "ordinal", "_ordinal"):
        value = getattr(inner, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 0


def dlpack_device_of(backend: ComputeBackend) -> tuple[int, int]:
    """The ``(device_type, device_id)`` that ``__dlpack_device__`` reports for arrays on ``backend``.

    CPU arrays and handle-backend arrays (exported as host copies) report
    ``(kDLCPU, 0)``; CUDA / ROCm arrays report their device and ordinal.
    """
    if host_backend(backend) is None and is_cuda_like(backend):
        inner = unwrap(backend)
        ordinal = backend_ordinal(inner)
        kind = DLDeviceType.ROCM if inner.name() == "rocm" else DLDeviceType.CUDA
        return int(kind), ordinal
    return int(DLDeviceType.CPU), 0


def host_bytes(backend: ComputeBackend, ptr: int, nbytes: int) -> npt.NDArray[np.uint8]:
    """A writable NumPy byte view of ``nbytes`` bytes at ``ptr`` on the CPU backend.

    The view references the allocation's own buffer, so it stays valid after the
    allocation is freed (the memory lives as long as the view).

    Raises
    ------
    InvalidArgumentError
        If the range is not inside a live allocation of the backend.
    UnsupportedError
        If ``backend`` is not a CPU backend (or its allocations are not NumPy buffers).
    """
    cpu = host_backend(backend)
    if cpu is None:
        raise UnsupportedError(f"the {backend.name()} backend's memory is not host-addressable")
    region = cpu._memory().resolve("ptr", ptr, nbytes)
    payload = region.payload
    if not isinstance(payload, np.ndarray) or payload.dtype != np.uint8 or payload.ndim != 1:
        raise UnsupportedError("this CPU backend's allocations are not NumPy byte buffers")
    view: npt.NDArray[np.uint8] = payload[region.offset : region.offset + nbytes]
    return view


def _inside_allocation(cpu: TableBackend, base: int, nbytes: int) -> Allocation | None:
    """The live allocation that wholly contains ``[base, base + nbytes)``, if any."""
    try:
        return cpu._memory().resolve("ptr", base, nbytes).allocation
    except InvalidArgumentError:
        return None


def register_host_array(backend: ComputeBackend, array: npt.NDArray[Any]) -> int:
    """Register a C-contiguous, writable host array as a borrowed range; return its address.

    The allocation's payload is a byte view of ``array`` (which keeps the exporter's
    memory alive while the range is registered). ``backend.free(ptr)`` unregisters it
    without freeing anything.

    Raises
    ------
    InvalidArgumentError
        If the range overlaps a live allocation, or the array is empty / unsuitable.
    """
    cpu = host_backend(backend)
    if cpu is None:
        raise InvalidArgumentError(f"the {backend.name()} backend cannot borrow host memory")
    if not array.flags.c_contiguous or not array.flags.writeable or array.nbytes == 0:
        raise InvalidArgumentError("only non-empty, writable, C-contiguous host memory can be borrowed")
    payload = array.reshape(-1).view(np.uint8)
    base = int(array.ctypes.data)
    cpu._memory().insert(Allocation(base, int(array.nbytes), payload, borrowed=True))
    return base


# --------------------------------------------------------------------------- CUDA (CuPy)


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise UnsupportedError(f"DLPack exchange of CUDA memory needs CuPy ({exc})") from exc
    return cupy


def cuda_view(array: DeviceArray) -> Any:
    """A ``cupy.ndarray`` over ``array``'s device memory (zero-copy; keeps the block alive).

    Raises
    ------
    UnsupportedError
        If CuPy is missing or the backend's allocations are not CuPy memory pointers.
    """
    cupy = _cupy()
    inner = unwrap(array.backend)
    table_of = getattr(inner, "_memory", None)
    if table_of is None:
        raise UnsupportedError(f"the {inner.name()} backend keeps no pointer table to export from")
    ptr = array.ptr
    if array.size:
        lo = sum(min(0, (d - 1) * st) for d, st in zip(array.shape, array.strides, strict=True))
        hi = sum(max(0, (d - 1) * st) for d, st in zip(array.shape, array.strides, strict=True))
        region = table_of().resolve("ptr", ptr + lo, hi - lo + array.itemsize)
    else:
        region = table_of().resolve("ptr", ptr, 0)
    memory = getattr(region.payload, "mem", None)
    if memory is None or not hasattr(memory, "ptr"):
        raise UnsupportedError(f"the {inner.name()} backend's allocations are not CuPy memory")
    with cupy.cuda.Device(backend_ordinal(inner)):
        memptr = cupy.cuda.MemoryPointer(memory, ptr - int(memory.ptr))
        return cupy.ndarray(array.shape, array.dtype, memptr=memptr, strides=array.strides)


def export_cuda(array: DeviceArray, *, stream: Any, max_version: Any, copy: bool | None) -> Any:
    """The DLPack capsule of a CUDA / ROCm array, produced by CuPy on the array's device."""
    cupy = _cupy()
    view = cuda_view(array)
    with cupy.cuda.Device(backend_ordinal(array.backend)):
        try:
            return view.__dlpack__(stream=stream, max_version=max_version, copy=copy)
        except TypeError:
            # CuPy releases before DLPack 1.0 know only ``stream``.
            return (view.copy() if copy else view).__dlpack__(stream=stream)


def _borrow_cuda(obj: Any, backend: ComputeBackend) -> DeviceArray | None:
    """Borrow device memory of ``backend``'s own device through CuPy, or ``None`` to copy."""
    from .array import DeviceArray

    device_of = getattr(obj, "__dlpack_device__", None)
    if device_of is None or isinstance(obj, np.ndarray):
        return None
    try:
        device = tuple(int(v) for v in device_of())
    except (TypeError, ValueError):
        return None
    if device != dlpack_device_of(backend):
        return None
    cupy = _cupy()
    with cupy.cuda.Device(backend_ordinal(backend)):
        array = cupy.from_dlpack(obj)
    nbytes = int(array.nbytes)
    base = int(array.data.ptr)
    if not nbytes or not array.flags.c_contiguous or base % array.dtype.itemsize:
        return None
    table = unwrap(backend)._memory()  # type: ignore[attr-defined]
    try:
        table.resolve("ptr", base, nbytes)
        return DeviceArray._external(backend, base, array.shape, array.dtype, keepalive=array)
    except InvalidArgumentError:
        pass
    try:
        table.insert(Allocation(base, nbytes, array.data, borrowed=True))
    except InvalidArgumentError:
        return None
    return DeviceArray._adopt(backend, base, array.shape, array.dtype)


# --------------------------------------------------------------------------- host memory


def _host_array(obj: Any) -> npt.NDArray[Any] | None:
    """A zero-copy NumPy array over ``obj``'s host memory, or ``None`` if that needs a copy."""
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__dlpack__"):
        try:
            return np.from_dlpack(obj, copy=False)
        except (BufferError, RuntimeError, TypeError, ValueError, BackendError):
            return None
    try:
        view = memoryview(obj)
    except TypeError:
        return None
    if not view.c_contiguous:
        return None
    try:
        return np.asarray(view)
    except (TypeError, ValueError):
        return None


def _host_copy(obj: Any) -> npt.NDArray[Any]:
    """``obj`` copied (or viewed) as a NumPy array in host memory, from any device."""
    if hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray):
        try:
            return np.from_dlpack(obj)
        except (BufferError, RuntimeError, TypeError, ValueError):
            try:
                return np.from_dlpack(obj, device="cpu", copy=True)
            except (BufferError, RuntimeError, TypeError, ValueError) as exc:
                raise InvalidArgumentError(
                    f"cannot bring a {type(obj).__name__} to host memory through DLPack: {exc}"
                ) from exc
    try:
        return np.asarray(obj)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"cannot read a {type(obj).__name__} as an array: {exc}") from exc


def from_dlpack(obj: Any, backend: ComputeBackend, *, copy: bool | None = None) -> DeviceArray:
    """Make a :class:`~computehal.array.DeviceArray` on ``backend`` from any DLPack exporter.

    Parameters
    ----------
    obj : object
        Anything with ``__dlpack__`` (NumPy, PyTorch, JAX, CuPy arrays, other
        DeviceArrays) or the buffer protocol.
    backend : ComputeBackend
        The (initialised) backend the result lives on.
    copy : bool, optional
        ``None`` (default): borrow the memory when the backend can address it in place
        (host memory on the CPU backend), copy otherwise. ``True``: always copy.
        ``False``: never copy; raise :class:`BufferError` when borrowing is impossible.

    Returns
    -------
    DeviceArray
        Borrowed arrays share memory with ``obj``: writes through either side are
        seen by the other. Releasing a borrowed array only unregisters the range.

    Raises
    ------
    BufferError
        If ``copy=False`` and the memory cannot be borrowed.
    InvalidArgumentError
        If ``obj`` cannot be read as an array.
    """
    from .array import DeviceArray, asarray

    if not isinstance(backend, ComputeBackend):
        raise InvalidArgumentError(f"backend must be a ComputeBackend, got {type(backend).__name__}")
    if isinstance(obj, DeviceArray) and obj.backend is backend and copy is not True:
        return obj
    cpu = host_backend(backend)
    if cpu is None and copy is not True and is_cuda_like(backend):
        borrowed_cuda = _borrow_cuda(obj, backend)
        if borrowed_cuda is not None:
            return borrowed_cuda
    if cpu is not None and copy is not True:
        host = _host_array(obj)
        if host is not None:
            borrowed = _borrow(cpu, backend, host)
            if borrowed is not None:
                return borrowed
    if copy is False:
        raise BufferError(
            f"cannot borrow this {type(obj).__name__} on the {backend.name()} backend without a copy "
            "(only writable, aligned, C-contiguous host memory can be borrowed, and only by the CPU "
            "backend, and same-device CUDA memory only by the CUDA backend)"
        )
    return asarray(_host_copy(obj), backend, copy=True)


def _borrow(cpu: TableBackend, backend: ComputeBackend, host: npt.NDArray[Any]) -> DeviceArray | None:
    """Borrow ``host`` on the CPU backend, or ``None`` when it must be copied."""
    from .array import DeviceArray

    if (
        host.nbytes == 0
        or not host.flags.c_contiguous
        or not host.flags.writeable
        or not host.flags.aligned
        or host.dtype.hasobject
    ):
        return None
    base = int(host.ctypes.data)
    allocation = _inside_allocation(cpu, base, int(host.nbytes))
    if allocation is not None:
        # Memory of one of our own allocations coming back: a view of it. The exported
        # NumPy array keeps the memory itself alive.
        return DeviceArray._external(backend, base, host.shape, host.dtype, keepalive=host)
    try:
        ptr = register_host_array(cpu, host)
    except InvalidArgumentError:
        return None  # straddles a live allocation: copy
    return DeviceArray._adopt(backend, ptr, host.shape, host.dtype)

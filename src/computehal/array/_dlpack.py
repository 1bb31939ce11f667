"""DLPack interop of arrays: zero-copy exchange with NumPy, PyTorch, JAX, CuPy where memory allows.

Everything here asks the backend through its public methods: ``dlpack_device()`` says
where its memory is, ``host_view()`` gives zero-copy host access, ``allocation_of()``
tells whether memory already belongs to it, and ``borrow()`` registers foreign memory.

Export (``DeviceArray.__dlpack__``)
    * Host memory (the CPU backend): zero-copy. The export is a NumPy view of the
      allocation, which keeps the memory alive even after the array (or the backend)
      has released it.
    * Backends whose ``dlpack_device()`` is None (OpenCL ``cl_mem``, wgpu buffers):
      export by copy only. ``__dlpack_device__`` reports ``(kDLCPU, 0)`` (the device the
      exported data lands on), ``__dlpack__`` copies the data to the host, and
      ``copy=False`` raises :class:`BufferError` as the DLPack / array-API standard
      requires when a copy would be needed.
    * CUDA / ROCm memory (through CuPy): ``__dlpack_device__`` reports the backend's
      device and the export is zero-copy: a CuPy array over the memory (keeping the
      array alive) exports itself, honouring the consumer's ``stream``. Arrays also
      offer ``__cuda_array_interface__`` (version 3). ``dl_device=(kDLCPU, 0)`` gives a
      host copy.

Import (:func:`from_dlpack`)
    Memory on the backend's own DLPack device (host memory for the CPU backend,
    same-device memory for CUDA) that is contiguous and writable is *borrowed*:
    registered with ``backend.borrow`` (the backend never frees it; releasing the array
    only unregisters it) and kept alive by the array. Memory that already belongs to a
    live allocation of the same backend (an array exported and imported again) becomes
    a view of that allocation. Everything else is copied; ``copy=False`` then raises
    :class:`BufferError`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from ..dlpack import CUDA_DEVICE_TYPES, HOST_DEVICE_TYPES, DLDeviceType, cupy_module
from ..errors import BackendError, InvalidArgumentError
from ._core import DeviceArray
from ._create import asarray
from ._shapes import span

__all__ = ["from_dlpack", "dlpack_device_of", "export", "cuda_array_interface", "cuda_view"]

_CPU = (int(DLDeviceType.CPU), 0)


def dlpack_device_of(backend: ComputeBackend) -> tuple[int, int]:
    """What ``__dlpack_device__`` reports for arrays on ``backend``.

    The backend's own ``dlpack_device()``, or ``(kDLCPU, 0)`` for backends whose memory
    leaves the device only by copy (their export is a host copy).
    """
    device = backend.dlpack_device()
    return _CPU if device is None else (int(device[0]), int(device[1]))


def _is_cuda(device: tuple[int, int]) -> bool:
    return device[0] in CUDA_DEVICE_TYPES


# --------------------------------------------------------------------------- export


def export(
    array: DeviceArray,
    *,
    stream: Any,
    max_version: tuple[int, int] | None,
    dl_device: tuple[int, int] | None,
    copy: bool | None,
) -> Any:
    """The DLPack capsule of ``array`` (the arguments of ``__dlpack__``)."""
    array._check_live()
    own = dlpack_device_of(array.backend)
    if dl_device is not None:
        try:
            requested = (int(dl_device[0]), int(dl_device[1]))
        except (TypeError, ValueError, IndexError):
            raise BufferError(
                f"dl_device must be a (device_type, device_id) pair, got {dl_device!r}"
            ) from None
        if requested not in (own, _CPU):
            raise BufferError(f"cannot export to DLPack device {dl_device!r}; this array is on {own}")
        dl_device = requested
    cuda = _is_cuda(own)
    if stream is not None and not cuda:
        raise BufferError(f"stream must be None for arrays on the {array.backend.name()} backend")
    host = array._host_view()
    if host is not None:
        return host.__dlpack__(max_version=max_version, dl_device=dl_device, copy=copy)
    if cuda and dl_device in (None, own):
        return _export_cuda(array, own, stream=stream, max_version=max_version, copy=copy)
    if copy is False:
        raise BufferError(
            f"the {array.backend.name()} backend's memory is not host memory: this DLPack export "
            "needs a host copy (copy=False is impossible)"
        )
    return array.numpy(copy=True).__dlpack__(max_version=max_version, dl_device=dl_device, copy=False)


def cuda_view(array: DeviceArray) -> Any:
    """A ``cupy.ndarray`` over ``array``'s CUDA / ROCm memory (zero-copy; keeps ``array`` alive).

    Raises
    ------
    UnsupportedError
        If CuPy is missing.
    BufferError
        If the array is not in CUDA / ROCm memory.
    """
    device = dlpack_device_of(array.backend)
    if not _is_cuda(device):
        raise BufferError(f"arrays on the {array.backend.name()} backend are not CUDA memory")
    cupy = cupy_module()
    lo, hi = span(array.shape, array.strides, array.itemsize)
    start = array.ptr + lo
    with cupy.cuda.Device(device[1]):
        memory = cupy.cuda.UnownedMemory(start, hi - lo, array, device[1])
        pointer = cupy.cuda.MemoryPointer(memory, -lo)
        return cupy.ndarray(array.shape, array.dtype, memptr=pointer, strides=array.strides)


def _export_cuda(
    array: DeviceArray, device: tuple[int, int], *, stream: Any, max_version: Any, copy: bool | None
) -> Any:
    cupy = cupy_module()
    view = cuda_view(array)
    with cupy.cuda.Device(device[1]):
        try:
            return view.__dlpack__(stream=stream, max_version=max_version, copy=copy)
        except TypeError:
            # CuPy releases before DLPack 1.0 know only ``stream``.
            return (view.copy() if copy else view).__dlpack__(stream=stream)


def cuda_array_interface(array: DeviceArray) -> dict[str, Any]:
    """``__cuda_array_interface__`` (version 3); AttributeError where the memory is not CUDA memory."""
    if not _is_cuda(dlpack_device_of(array.backend)):
        raise AttributeError(f"arrays on the {array.backend.name()} backend are not CUDA memory")
    ptr = array.ptr
    return {
        "shape": array.shape,
        "typestr": array.dtype.str,
        "descr": array.dtype.descr,
        "data": (ptr if array.size else 0, False),
        "strides": None if array.is_contiguous else array.strides,
        "version": 3,
        "stream": 1,
    }


# --------------------------------------------------------------------------- import


class _Memory(NamedTuple):
    """Contiguous memory of an exporter: where it is, its shape and dtype, and what keeps it alive."""

    address: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    owner: Any


def _host_array(obj: Any) -> npt.NDArray[Any] | None:
    """A zero-copy NumPy array over ``obj``'s host memory, or None if that needs a copy."""
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


def _host_memory(obj: Any) -> _Memory | None:
    host = _host_array(obj)
    if host is None or host.nbytes == 0 or host.dtype.hasobject:
        return None
    flags = host.flags
    if not (flags.c_contiguous and flags.writeable and flags.aligned):
        return None
    return _Memory(int(host.ctypes.data), int(host.nbytes), host.shape, host.dtype, host)


def _cuda_memory(obj: Any, device: tuple[int, int]) -> _Memory | None:
    """``obj``'s memory when it is on ``device`` (through ``cupy.from_dlpack``), else None."""
    device_of = getattr(obj, "__dlpack_device__", None)
    if device_of is None or isinstance(obj, np.ndarray):
        return None
    try:
        if tuple(int(v) for v in device_of()) != device:
            return None
    except (TypeError, ValueError):
        return None
    cupy = cupy_module()
    with cupy.cuda.Device(device[1]):
        array = cupy.from_dlpack(obj)
    if not array.nbytes or not array.flags.c_contiguous or int(array.data.ptr) % array.dtype.itemsize:
        return None
    return _Memory(int(array.data.ptr), int(array.nbytes), array.shape, array.dtype, array)


def _borrow(obj: Any, backend: ComputeBackend) -> DeviceArray | None:
    """``obj``'s memory on ``backend`` without a copy, or None when it must be copied."""
    device = backend.dlpack_device()
    if device is None:
        return None
    if device[0] in HOST_DEVICE_TYPES:
        memory = _host_memory(obj)
    elif _is_cuda((int(device[0]), int(device[1]))):
        memory = _cuda_memory(obj, (int(device[0]), int(device[1])))
    else:
        return None
    if memory is None:
        return None
    try:
        info = backend.allocation_of(memory.address)
    except BackendError:
        return None
    if info is not None and memory.address < info.base + info.size:
        if memory.address + memory.nbytes > info.base + info.size:
            return None  # straddles the end of one of our allocations: copy
        # Memory of one of our own allocations coming back: a view of it, keeping the exporter alive.
        return DeviceArray._external(backend, memory.address, memory.shape, memory.dtype, memory.owner)
    try:
        ptr = backend.borrow(memory.address, memory.nbytes, memory.owner)
    except BackendError:
        return None  # the backend cannot borrow it (or it overlaps a live allocation): copy
    return DeviceArray._adopt(backend, ptr, memory.shape, memory.dtype)


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
        (host memory on the CPU backend, same-device memory on CUDA), copy otherwise.
        ``True``: always copy. ``False``: never copy; raise :class:`BufferError` when
        borrowing is impossible.

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
    if not isinstance(backend, ComputeBackend):
        raise InvalidArgumentError(f"backend must be a ComputeBackend, got {type(backend).__name__}")
    if isinstance(obj, DeviceArray) and obj.backend is backend and copy is not True:
        return obj
    if copy is not True:
        borrowed = _borrow(obj, backend)
        if borrowed is not None:
            return borrowed
    if copy is False:
        raise BufferError(
            f"cannot borrow this {type(obj).__name__} on the {backend.name()} backend without a copy "
            "(only writable, aligned, contiguous memory on the backend's own DLPack device can be "
            "borrowed: host memory by the CPU backend, same-device memory by CUDA)"
        )
    return asarray(_host_copy(obj), backend, copy=True)

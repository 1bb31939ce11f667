"""DeviceArray: a typed, shaped view of backend memory, with ownership.

Every array references one :class:`_Holder`, the single owner of an allocation. The
holder frees the allocation exactly once: when the owning array's :meth:`DeviceArray.free`
runs (directly or on leaving a ``with`` block), or when the holder is garbage collected
(a :func:`weakref.finalize`, never ``__del__``), which happens once the owning array and
every view of it are gone. Views and slices are interior pointers into the same
allocation and reference the holder, so they keep the memory alive.
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, SupportsIndex

import numpy as np
import numpy.typing as npt

from .. import dlpack as _dl
from ..backend import ComputeBackend
from ..errors import BackendError, InvalidArgumentError
from ..memory import Allocation

__all__ = ["DeviceArray", "Device", "asarray", "to_device", "empty", "zeros"]

ShapeLike = SupportsIndex | Sequence[SupportsIndex]


@dataclass(frozen=True)
class Device:
    """Where an array lives: a backend name and device ordinal, e.g. ``cpu:0``."""

    backend: str
    ordinal: int = 0

    def __str__(self) -> str:
        return f"{self.backend}:{self.ordinal}"


# --------------------------------------------------------------------------- ownership

_UNKNOWN = object()


def _live_allocation(backend: ComputeBackend, base: int) -> Any:
    """The table entry at ``base`` (an :class:`Allocation`), ``None`` if none is live there,
    or ``_UNKNOWN`` when the backend keeps no table that can be inspected."""
    inner = _dl.unwrap(backend)
    table_of = getattr(inner, "_memory", None)
    if table_of is None:
        return _UNKNOWN
    try:
        allocation = table_of().resolve("ptr", base, 0).allocation
    except BackendError:
        return None
    return allocation if isinstance(allocation, Allocation) and allocation.base == base else None


def _release(backend: ComputeBackend, base: int, token: Any, quiet: bool) -> None:
    """Free (or unregister) the allocation at ``base`` if it is still the one we own.

    ``token`` is the :class:`Allocation` recorded at creation: if the table now holds a
    different allocation at that address (ours was released by ``backend.close()`` and
    the address reused), nothing is freed. With ``quiet`` (garbage collection) a
    :class:`BackendError` is swallowed: the backend may be closed or gone already.
    """
    try:
        if token is not _UNKNOWN:
            current = _live_allocation(backend, base)
            if current is not _UNKNOWN and current is not token:
                return  # already released with the backend (close()) or by a raw free()
        backend.free(base)
    except BackendError:
        if not quiet:
            raise


class _Holder:
    """Owns one allocation (or borrowed range) and frees it exactly once."""

    __slots__ = ("backend", "base", "owned", "keepalive", "_finalizer", "__weakref__")

    def __init__(self, backend: ComputeBackend, base: int, *, owned: bool, keepalive: Any = None) -> None:
        self.backend = backend
        self.base = base
        self.owned = owned
        self.keepalive = keepalive
        self._finalizer: weakref.finalize[Any, Any] | None = None
        if owned:
            token = _live_allocation(backend, base)
            finalizer = weakref.finalize(self, _release, backend, base, token, True)
            finalizer.atexit = False
            self._finalizer = finalizer

    @property
    def alive(self) -> bool:
        """False once the allocation has been freed."""
        return self._finalizer is None or self._finalizer.alive

    def release(self) -> None:
        """Free the allocation now (idempotent); errors of the backend propagate."""
        if self._finalizer is None:
            return
        detached = self._finalizer.detach()
        if detached is None:
            return
        _, _, args, _ = detached
        backend, base, token, _quiet = args
        _release(backend, base, token, False)


# --------------------------------------------------------------------------- helpers


def _as_shape(shape: Any, name: str = "shape") -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)):
        raise InvalidArgumentError(f"{name} must be a sequence of integers, got {type(shape).__name__}")
    if isinstance(shape, Iterable):
        items = list(shape)
    else:
        items = [shape]
    dims: list[int] = []
    for i, item in enumerate(items):
        if isinstance(item, bool):
            raise InvalidArgumentError(f"{name}[{i}] must be an integer, got a bool")
        try:
            dim = operator.index(item)
        except TypeError:
            raise InvalidArgumentError(f"{name}[{i}] must be an integer, got {type(item).__name__}") from None
        if dim < 0:
            raise InvalidArgumentError(f"{name}[{i}] = {dim} must be >= 0")
        dims.append(dim)
    return tuple(dims)


def _as_dtype(dtype: Any) -> np.dtype[Any]:
    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"dtype {dtype!r} is not a NumPy dtype") from None
    if dt.hasobject or dt.itemsize == 0:
        raise InvalidArgumentError(f"dtype {dt} has no fixed-size binary representation")
    return dt


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    step = itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def _span(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """Byte offsets ``[lo, hi)`` relative to the first element that the array touches."""
    if any(dim == 0 for dim in shape):
        return 0, 0
    lo = sum(min(0, (dim - 1) * st) for dim, st in zip(shape, strides, strict=True))
    hi = sum(max(0, (dim - 1) * st) for dim, st in zip(shape, strides, strict=True)) + itemsize
    return lo, hi


def _check_backend(backend: Any) -> ComputeBackend:
    if not isinstance(backend, ComputeBackend):
        raise InvalidArgumentError(f"backend must be a ComputeBackend, got {type(backend).__name__}")
    return backend


# --------------------------------------------------------------------------- DeviceArray


class DeviceArray:
    """An n-dimensional array in the memory of a :class:`~computehal.ComputeBackend`.

    Create arrays with :func:`asarray` / :func:`to_device`, :func:`empty`,
    :func:`zeros` or :func:`~computehal.from_dlpack`; never call the constructor.

    Attributes
    ----------
    ptr : int
        Device pointer of the first element (an interior pointer for views).
    shape : tuple of int
        Dimensions.
    dtype : numpy.dtype
        Element type.
    strides : tuple of int
        Byte strides, row-major (C order) for freshly created arrays.
    backend : ComputeBackend
        The backend that owns the memory.

    Notes
    -----
    Ownership: an array made by :func:`empty`, :func:`zeros` or :func:`asarray` owns its
    allocation and frees it exactly once: on :meth:`free`, on leaving a ``with`` block,
    or when it and all of its views have been garbage collected. Views (``a[1:3]``,
    ``a.reshape(...)``, ``a.T``) share the allocation and keep it alive; after the
    owner's :meth:`free` they are invalid (using them raises
    :class:`~computehal.InvalidArgumentError`). Arrays borrowed with
    :func:`~computehal.from_dlpack` only unregister the external memory.
    """

    __array_priority__ = 100

    _holder: _Holder
    _ptr: int
    _shape: tuple[int, ...]
    _dtype: np.dtype[Any]
    _strides: tuple[int, ...]
    _base: DeviceArray | None
    _released: bool

    def __init__(self, *_: Any, **__: Any) -> None:
        raise TypeError("use computehal.asarray / empty / zeros / from_dlpack to create a DeviceArray")

    @classmethod
    def _make(
        cls,
        holder: _Holder,
        ptr: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        strides: tuple[int, ...],
        base: DeviceArray | None,
    ) -> DeviceArray:
        self = object.__new__(cls)
        self._holder = holder
        self._ptr = ptr
        self._shape = shape
        self._dtype = dtype
        self._strides = strides
        self._base = base
        self._released = False
        return self

    @classmethod
    def _adopt(cls, backend: ComputeBackend, ptr: int, shape: Sequence[int], dtype: Any) -> DeviceArray:
        """Wrap an allocation (or borrowed range) at ``ptr``; the array owns it from now on."""
        dt = np.dtype(dtype)
        dims = tuple(int(d) for d in shape)
        holder = _Holder(backend, ptr, owned=True)
        return cls._make(holder, ptr, dims, dt, _c_strides(dims, dt.itemsize), None)

    @classmethod
    def _external(
        cls, backend: ComputeBackend, ptr: int, shape: Sequence[int], dtype: Any, keepalive: Any
    ) -> DeviceArray:
        """A non-owning C-contiguous array at ``ptr`` that keeps ``keepalive`` alive."""
        dt = np.dtype(dtype)
        dims = tuple(int(d) for d in shape)
        holder = _Holder(backend, ptr, owned=False, keepalive=keepalive)
        return cls._make(holder, ptr, dims, dt, _c_strides(dims, dt.itemsize), None)

    @classmethod
    def from_pointer(
        cls,
        backend: ComputeBackend,
        ptr: int,
        shape: ShapeLike,
        dtype: Any = "float32",
        *,
        own: bool = False,
    ) -> DeviceArray:
        """Wrap memory obtained from the pointer API as a C-contiguous array.

        Parameters
        ----------
        backend : ComputeBackend
            The backend ``ptr`` belongs to.
        ptr : int
            Pointer to the first element.
        shape : int or sequence of int
            Dimensions.
        dtype : dtype, optional
            Element type (default float32).
        own : bool, optional
            If True, ``ptr`` must be the base of an allocation and the array frees it
            (exactly once, like any owning array). If False (default), the caller keeps
            ownership and must keep the allocation alive while the array is used.
        """
        be = _check_backend(backend)
        dims = _as_shape(shape)
        dt = _as_dtype(dtype)
        address = int(operator.index(ptr))
        if address <= 0:
            raise InvalidArgumentError(f"ptr = {address} is not a valid pointer")
        holder = _Holder(be, address, owned=own)
        return cls._make(holder, address, dims, dt, _c_strides(dims, dt.itemsize), None)

    # ------------------------------------------------------------------ attributes

    @property
    def backend(self) -> ComputeBackend:
        """The backend whose memory holds the array."""
        return self._holder.backend

    @property
    def device(self) -> Device:
        """The device the array lives on (backend name and device ordinal)."""
        return Device(self._holder.backend.name(), _dl.backend_ordinal(self._holder.backend))

    @property
    def ptr(self) -> int:
        """Pointer of the first element; raises once the memory has been freed."""
        self._check_live()
        return self._ptr

    @property
    def shape(self) -> tuple[int, ...]:
        """The dimensions."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The element type."""
        return self._dtype

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte step between consecutive elements along each axis."""
        return self._strides

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of data (``size * itemsize``)."""
        return self.size * self._dtype.itemsize

    @property
    def base(self) -> DeviceArray | None:
        """The array this one is a view of, or ``None`` for an array that owns its memory."""
        return self._base

    @property
    def is_contiguous(self) -> bool:
        """True when the elements are laid out densely in row-major (C) order."""
        if self.size == 0:
            return True
        expected = self._dtype.itemsize
        for dim, stride in zip(reversed(self._shape), reversed(self._strides), strict=True):
            if dim != 1 and stride != expected:
                return False
            expected *= dim
        return True

    @property
    def freed(self) -> bool:
        """True once the memory is released (or this view has been released)."""
        return self._released or not self._holder.alive

    @property
    def T(self) -> DeviceArray:  # noqa: N802 - NumPy's name
        """The transposed view (axes reversed); no data is moved."""
        return self.transpose()

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d array")
        return self._shape[0]

    def __repr__(self) -> str:
        state = ", freed" if self.freed else ""
        return (
            f"DeviceArray(shape={self._shape}, dtype={self._dtype}, device={self.device}, "
            f"ptr={self._ptr:#x}{state})"
        )

    def _check_live(self) -> None:
        if self._released:
            raise InvalidArgumentError("this array view has been released with free()")
        if not self._holder.alive:
            raise InvalidArgumentError(f"the memory of this array (at {self._ptr:#x}) has been freed")

    # ------------------------------------------------------------------ lifetime

    def free(self) -> None:
        """Release the memory now.

        On an owning array this frees the allocation (exactly once; calling it again
        does nothing) and invalidates every view. On a view it releases only the
        view's hold: the allocation stays until the owner frees it or every array on
        it has been collected.

        Raises
        ------
        BackendError
            If the backend refuses the free (for example because the pointer was
            already freed through the pointer API).
        """
        if self._base is None:
            self._holder.release()
        self._released = True

    def __enter__(self) -> DeviceArray:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.free()

    # ------------------------------------------------------------------ views

    def _view(self, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> DeviceArray:
        self._check_live()
        root = self._base if self._base is not None else self
        ptr = self._ptr + offset if math.prod(shape) else self._ptr
        return DeviceArray._make(self._holder, ptr, shape, self._dtype, strides, root)

    def __getitem__(self, key: Any) -> DeviceArray:
        """Basic indexing (integers, slices with any step, ``...``, ``None``): a view."""
        items = list(key) if isinstance(key, tuple) else [key]
        if sum(1 for item in items if item is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        used = sum(1 for item in items if item is not None and item is not Ellipsis)
        if used > self.ndim:
            raise IndexError(f"too many indices: array is {self.ndim}-dimensional, but {used} were indexed")
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items[at : at + 1] = [slice(None)] * (self.ndim - used)
        else:
            items.extend([slice(None)] * (self.ndim - used))
        offset = 0
        shape: list[int] = []
        strides: list[int] = []
        axis = 0
        for item in items:
            if item is None:
                shape.append(1)
                strides.append(0)
                continue
            dim, stride = self._shape[axis], self._strides[axis]
            if isinstance(item, slice):
                start, stop, step = item.indices(dim)
                length = len(range(start, stop, step))
                if length:
                    offset += start * stride
                shape.append(length)
                strides.append(stride * step)
            else:
                if isinstance(item, bool):
                    raise IndexError("boolean indices are not supported (only basic indexing)")
                try:
                    index = operator.index(item)
                except TypeError:
                    raise IndexError(
                        f"only integers, slices, '...' and None are valid indices, got {type(item).__name__}"
                    ) from None
                if not -dim <= index < dim:
                    raise IndexError(f"index {index} is out of bounds for axis {axis} with size {dim}")
                offset += (index % dim) * stride
            axis += 1
        return self._view(offset, tuple(shape), tuple(strides))

    def reshape(self, *shape: Any) -> DeviceArray:
        """A view with a new shape (one dimension may be -1); the array must be C-contiguous.

        Raises
        ------
        InvalidArgumentError
            If the sizes differ or the array is not contiguous (``copy()`` it first).
        """
        raw = shape[0] if len(shape) == 1 and not isinstance(shape[0], SupportsIndex) else shape
        dims = list(raw) if isinstance(raw, Iterable) else [raw]
        wanted: list[int] = []
        unknown = -1
        for i, item in enumerate(dims):
            try:
                value = operator.index(item)
            except TypeError:
                raise InvalidArgumentError(
                    f"shape[{i}] must be an integer, got {type(item).__name__}"
                ) from None
            if value == -1:
                if unknown >= 0:
                    raise InvalidArgumentError("can only specify one unknown dimension (-1)")
                unknown = i
                wanted.append(1)
            elif value < 0:
                raise InvalidArgumentError(f"shape[{i}] = {value} must be >= 0 or -1")
            else:
                wanted.append(value)
        known = math.prod(wanted)
        if unknown >= 0:
            if known == 0 or self.size % known:
                raise InvalidArgumentError(f"cannot reshape an array of size {self.size} into {tuple(dims)}")
            wanted[unknown] = self.size // known
        new_shape = tuple(wanted)
        if math.prod(new_shape) != self.size:
            raise InvalidArgumentError(f"cannot reshape an array of size {self.size} into {new_shape}")
        if not self.is_contiguous:
            raise InvalidArgumentError("reshape needs a C-contiguous array; copy() it first")
        return self._view(0, new_shape, _c_strides(new_shape, self.itemsize))

    def ravel(self) -> DeviceArray:
        """The contiguous array as one dimension (a view)."""
        return self.reshape(-1)

    def transpose(self, *axes: int) -> DeviceArray:
        """A view with permuted axes (reversed by default)."""
        order = list(axes[0]) if len(axes) == 1 and isinstance(axes[0], Iterable) else list(axes)
        if not order:
            order = list(range(self.ndim))[::-1]
        if sorted(order) != list(range(self.ndim)):
            raise InvalidArgumentError(f"axes {tuple(order)} are not a permutation of {self.ndim} axes")
        return self._view(0, tuple(self._shape[i] for i in order), tuple(self._strides[i] for i in order))

    # ------------------------------------------------------------------ host transfer

    def _host_view(self) -> npt.NDArray[Any]:
        """A zero-copy NumPy view of the array on the CPU backend (keeps the memory alive)."""
        self._check_live()
        keep = self._holder.keepalive
        if isinstance(keep, np.ndarray) and self._ptr == self._holder.base and self._base is None:
            return keep
        lo, hi = _span(self._shape, self._strides, self.itemsize)
        raw = _dl.host_bytes(self.backend, self._ptr + lo, hi - lo)
        return np.ndarray(self._shape, self._dtype, buffer=raw, offset=-lo, strides=self._strides)

    def numpy(self, *, copy: bool = True) -> npt.NDArray[Any]:
        """The array's data as a NumPy array.

        Parameters
        ----------
        copy : bool, optional
            True (default): an independent host copy. False: a zero-copy view of the
            memory (CPU backend only; it keeps the memory alive).

        Raises
        ------
        BufferError
            If ``copy=False`` and the memory is not host-addressable.
        """
        self._check_live()
        if _dl.host_backend(self.backend) is not None:
            view = self._host_view()
            return view.copy() if copy else view
        if not copy:
            raise BufferError(
                f"the {self.backend.name()} backend's memory is not host-addressable; "
                "numpy(copy=False) is only possible on the CPU backend"
            )
        if self.is_contiguous:
            out = np.empty(self._shape, self._dtype)
            if out.nbytes:
                self.backend.copy_dtoh(out, self._ptr)
            return out
        lo, hi = _span(self._shape, self._strides, self.itemsize)
        raw = np.empty(hi - lo, np.uint8)
        if raw.nbytes:
            self.backend.copy_dtoh(raw, self._ptr + lo)
        strided = np.ndarray(self._shape, self._dtype, buffer=raw, offset=-lo, strides=self._strides)
        return strided.copy()

    def to_host(self) -> npt.NDArray[Any]:
        """An independent NumPy copy of the data (same as ``numpy()``)."""
        return self.numpy(copy=True)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> npt.NDArray[Any]:
        if copy is False and _dl.host_backend(self.backend) is None:
            raise ValueError("a DeviceArray on a non-CPU backend cannot be viewed by NumPy without a copy")
        result = self.numpy(copy=copy is True or _dl.host_backend(self.backend) is None)
        if dtype is not None and np.dtype(dtype) != result.dtype:
            return result.astype(dtype)
        return result

    def copy_from(self, source: Any) -> None:
        """Overwrite the array's elements with ``source`` (broadcast to the shape, cast to the dtype).

        Works for views and strided arrays too; on non-CPU backends a strided target is
        updated by a read-modify-write of the bytes it spans.
        """
        self._check_live()
        try:
            data = np.broadcast_to(np.asarray(source, dtype=self._dtype), self._shape)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"cannot write {type(source).__name__} into {self}: {exc}") from exc
        if self.size == 0:
            return
        if _dl.host_backend(self.backend) is not None:
            self._host_view()[...] = data
            return
        if self.is_contiguous:
            self.backend.copy_htod(self._ptr, np.ascontiguousarray(data))
            return
        lo, hi = _span(self._shape, self._strides, self.itemsize)
        raw = np.empty(hi - lo, np.uint8)
        self.backend.copy_dtoh(raw, self._ptr + lo)
        np.ndarray(self._shape, self._dtype, buffer=raw, offset=-lo, strides=self._strides)[...] = data
        self.backend.copy_htod(self._ptr + lo, raw)

    def copy(self) -> DeviceArray:
        """A new C-contiguous array with the same data on the same backend."""
        return asarray(
            self.numpy(copy=False) if _dl.host_backend(self.backend) else self.numpy(), self.backend
        )

    def to_device(self, backend: ComputeBackend) -> DeviceArray:
        """This array on ``backend``: itself if it is already there, else a copy."""
        if backend is self.backend:
            return self
        return asarray(self.numpy(copy=_dl.host_backend(self.backend) is None), backend)

    # ------------------------------------------------------------------ DLPack

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)``: ``(kDLCPU, 0)`` for the CPU backend and for
        handle backends (whose export is a host copy); CUDA / ROCm report their device."""
        return _dl.dlpack_device_of(self.backend)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """Export the array as a DLPack capsule (array-API ``__dlpack__`` semantics).

        Parameters
        ----------
        stream : int or None
            CUDA / ROCm: the consumer's stream (CuPy's rules: None or 1 legacy default,
            2 per-thread, -1 no synchronisation, else a stream pointer); the export is
            ordered after the backend's work. Every other backend accepts only None
            (their operations are complete when the call returns).
        max_version : tuple of int, optional
            Highest DLPack version the consumer understands; ``(1, x)`` gets a versioned
            capsule, ``None`` or ``(0, x)`` the legacy one.
        dl_device : tuple of int, optional
            Requested device: None or the array's own device (``__dlpack_device__``),
            or ``(kDLCPU, 0)`` for a host copy of device memory.
        copy : bool, optional
            None: zero-copy where possible (CPU and CUDA backends), else a host copy.
            True: always a copy. False: never copy; raises :class:`BufferError` on
            backends whose memory is a handle (OpenCL, wgpu).

        Raises
        ------
        BufferError
            When the request cannot be met (a stream on a backend without streams, an
            unsupported device, ``copy=False`` on a handle backend).
        """
        self._check_live()
        own = _dl.dlpack_device_of(self.backend)
        cpu = (int(_dl.DLDeviceType.CPU), 0)
        if dl_device is not None:
            try:
                requested = (int(dl_device[0]), int(dl_device[1]))
            except (TypeError, ValueError, IndexError):
                raise BufferError(
                    f"dl_device must be a (device_type, device_id) pair, got {dl_device!r}"
                ) from None
            if requested not in (own, cpu):
                raise BufferError(f"cannot export to DLPack device {dl_device!r}; this array is on {own}")
            dl_device = requested
        cuda = own != cpu
        if stream is not None and not cuda:
            raise BufferError(f"stream must be None for arrays on the {self.backend.name()} backend")
        if _dl.host_backend(self.backend) is not None:
            return self._host_view().__dlpack__(max_version=max_version, dl_device=dl_device, copy=copy)
        if cuda and dl_device in (None, own):
            return _dl.export_cuda(self, stream=stream, max_version=max_version, copy=copy)
        if copy is False:
            raise BufferError(
                f"the {self.backend.name()} backend's memory is not host memory: this DLPack export "
                "needs a host copy (copy=False is impossible)"
            )
        host = self.numpy(copy=True)
        return host.__dlpack__(max_version=max_version, dl_device=dl_device, copy=False)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA Array Interface (version 3) of an array on the CUDA / ROCm backend.

        Absent (``AttributeError``) on every other backend. ``stream`` is 1: the backend
        works on the legacy default stream, so consumers order their work after it.
        """
        if _dl.host_backend(self.backend) is not None or not _dl.is_cuda_like(self.backend):
            raise AttributeError(f"arrays on the {self.backend.name()} backend are not CUDA memory")
        self._check_live()
        return {
            "shape": self._shape,
            "typestr": self._dtype.str,
            "descr": self._dtype.descr,
            "data": (self._ptr if self.size else 0, False),
            "strides": None if self.is_contiguous else self._strides,
            "version": 3,
            "stream": 1,
        }

    # ------------------------------------------------------------------ operators

    def __matmul__(self, other: DeviceArray) -> DeviceArray:
        from ._ops import matmul

        return matmul(self, other)

    def __add__(self, other: DeviceArray) -> DeviceArray:
        from ._ops import add

        return add(self, other)

    def __sub__(self, other: DeviceArray) -> DeviceArray:
        from ._ops import sub

        return sub(self, other)

    def __mul__(self, other: DeviceArray) -> DeviceArray:
        from ._ops import mul

        return mul(self, other)

    def __truediv__(self, other: DeviceArray) -> DeviceArray:
        from ._ops import div

        return div(self, other)

    def __neg__(self) -> DeviceArray:
        from ._ops import neg

        return neg(self)

    # Arrays compare by identity and are not hashable by value.
    __hash__ = object.__hash__


# --------------------------------------------------------------------------- creation


def empty(shape: ShapeLike, backend: ComputeBackend, *, dtype: Any = "float32") -> DeviceArray:
    """A new uninitialised C-contiguous array on ``backend``.

    Parameters
    ----------
    shape : int or sequence of int
        Dimensions (zero-size arrays are allowed; they still hold a valid pointer).
    backend : ComputeBackend
        An initialised backend.
    dtype : dtype, optional
        Element type (default float32).

    Returns
    -------
    DeviceArray
        An owning array (see :class:`DeviceArray` for when it is freed).
    """
    be = _check_backend(backend)
    dims = _as_shape(shape)
    dt = _as_dtype(dtype)
    nbytes = math.prod(dims) * dt.itemsize
    ptr = be.alloc(max(nbytes, dt.itemsize, 1))
    try:
        return DeviceArray._adopt(be, ptr, dims, dt)
    except BaseException:
        be.free(ptr)
        raise


def zeros(shape: ShapeLike, backend: ComputeBackend, *, dtype: Any = "float32") -> DeviceArray:
    """A new array of zeros on ``backend`` (see :func:`empty`)."""
    out = empty(shape, backend, dtype=dtype)
    if out.nbytes:
        out.backend.copy_htod(out.ptr, np.zeros(out.nbytes, np.uint8))
    return out


def asarray(obj: Any, backend: ComputeBackend, *, dtype: Any = None, copy: bool | None = None) -> DeviceArray:
    """Copy host data (a NumPy array or anything ``numpy.asarray`` accepts) to ``backend``.

    Parameters
    ----------
    obj : array_like or DeviceArray
        The data. A DeviceArray already on ``backend`` with the requested dtype is
        returned as it is unless ``copy=True``; one on another backend is transferred.
    backend : ComputeBackend
        An initialised backend.
    dtype : dtype, optional
        Element type of the result (default: the data's own).
    copy : bool, optional
        ``True`` forces a new allocation; ``False`` raises :class:`BufferError` if one
        is needed. Host data is always copied (use :func:`~computehal.from_dlpack` to
        borrow host memory).

    Returns
    -------
    DeviceArray
        A C-contiguous array.
    """
    be = _check_backend(backend)
    if isinstance(obj, DeviceArray):
        same = obj.backend is be and (dtype is None or np.dtype(dtype) == obj.dtype)
        if same and copy is not True:
            return obj
        if copy is False:
            raise BufferError("asarray(copy=False) would need a copy of this DeviceArray")
        host = obj.numpy(copy=_dl.host_backend(obj.backend) is None)
    else:
        if copy is False:
            raise BufferError("asarray copies host data; use computehal.from_dlpack to borrow it")
        try:
            host = np.asarray(obj, dtype=None if dtype is None else _as_dtype(dtype))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"cannot convert {type(obj).__name__} to an array: {exc}") from exc
    if dtype is not None:
        host = host.astype(_as_dtype(dtype), copy=False)
    dt = _as_dtype(host.dtype)
    out = empty(host.shape, be, dtype=dt)
    try:
        if host.size:
            be.copy_htod(out.ptr, np.ascontiguousarray(host))
    except BaseException:
        out.free()
        raise
    return out


def to_device(obj: Any, backend: ComputeBackend, *, dtype: Any = None) -> DeviceArray:
    """Alias of :func:`asarray`: move host data (or another backend's array) to ``backend``."""
    return asarray(obj, backend, dtype=dtype)

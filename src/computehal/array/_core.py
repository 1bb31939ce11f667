"""DeviceArray: a typed, shaped view of backend memory, with ownership.

Every array references one :class:`~computehal.array._holder.Holder`, the single owner
of an allocation; views and slices are interior pointers into the same allocation and
reference the same holder, so they keep the memory alive. The holder also tells when
the allocation was freed behind the arrays' back (``backend.free`` or ``close()``).

This module only *asks* the backend: ``allocation_of`` for the allocation's identity,
``host_view`` for zero-copy host access (None on device backends, which are read and
written by copies), ``dlpack_device`` for DLPack. Host transfers always move raw bytes,
so every dtype (bfloat16 and other extension types included) travels the same way.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..backend import ComputeBackend
from ..errors import InvalidArgumentError
from ._holder import Holder
from ._shapes import ShapeLike, as_dtype, as_shape, basic_index, c_strides, check_backend, reshaped, span

__all__ = ["DeviceArray", "Device"]


@dataclass(frozen=True)
class Device:
    """Where an array lives: a backend name and device ordinal, e.g. ``cpu:0``."""

    backend: str
    ordinal: int = 0

    def __str__(self) -> str:
        return f"{self.backend}:{self.ordinal}"


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

    _holder: Holder
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
        holder: Holder,
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
        holder = Holder(backend, ptr, owned=True)
        return cls._make(holder, ptr, dims, dt, c_strides(dims, dt.itemsize), None)

    @classmethod
    def _external(
        cls, backend: ComputeBackend, ptr: int, shape: Sequence[int], dtype: Any, keepalive: Any
    ) -> DeviceArray:
        """A non-owning C-contiguous array at ``ptr`` that keeps ``keepalive`` alive."""
        dt = np.dtype(dtype)
        dims = tuple(int(d) for d in shape)
        holder = Holder(backend, ptr, owned=False, keepalive=keepalive)
        return cls._make(holder, ptr, dims, dt, c_strides(dims, dt.itemsize), None)

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
        be = check_backend(backend)
        dims = as_shape(shape)
        dt = as_dtype(dtype)
        address = int(operator.index(ptr))
        if address <= 0:
            raise InvalidArgumentError(f"ptr = {address} is not a valid pointer")
        holder = Holder(be, address, owned=own)
        return cls._make(holder, address, dims, dt, c_strides(dims, dt.itemsize), None)

    # ------------------------------------------------------------------ attributes

    @property
    def backend(self) -> ComputeBackend:
        """The backend whose memory holds the array."""
        return self._holder.backend

    @property
    def device(self) -> Device:
        """The device the array lives on (backend name and the backend's ``device`` ordinal)."""
        backend = self._holder.backend
        ordinal = getattr(backend, "device", 0)
        return Device(backend.name(), ordinal if isinstance(ordinal, int) else 0)

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

    def __exit__(self, *exc_info: object) -> None:
        self.free()

    # ------------------------------------------------------------------ views

    def _view(self, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> DeviceArray:
        self._check_live()
        root = self._base if self._base is not None else self
        ptr = self._ptr + offset if math.prod(shape) else self._ptr
        return DeviceArray._make(self._holder, ptr, shape, self._dtype, strides, root)

    def __getitem__(self, key: Any) -> DeviceArray:
        """Basic indexing (integers, slices with any step, ``...``, ``None``): a view."""
        offset, shape, strides = basic_index(self._shape, self._strides, key)
        return self._view(offset, tuple(shape), tuple(strides))

    def reshape(self, *shape: Any) -> DeviceArray:
        """A view with a new shape (one dimension may be -1); the array must be C-contiguous.

        Raises
        ------
        InvalidArgumentError
            If the sizes differ or the array is not contiguous (``copy()`` it first).
        """
        new_shape = reshaped(self.size, shape)
        if not self.is_contiguous:
            raise InvalidArgumentError("reshape needs a C-contiguous array; copy() it first")
        return self._view(0, new_shape, c_strides(new_shape, self.itemsize))

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

    def _host_view(self) -> npt.NDArray[Any] | None:
        """A zero-copy NumPy view of the array where the backend's memory is host memory, else None.

        The view keeps the memory alive (it means nothing once the array is freed).
        """
        self._check_live()
        lo, hi = span(self._shape, self._strides, self.itemsize)
        view = self.backend.host_view(self._ptr + lo, hi - lo)
        if view is None:
            return None
        raw = np.frombuffer(view, dtype=np.uint8)
        return np.ndarray(self._shape, self._dtype, buffer=raw, offset=-lo, strides=self._strides)

    def _host_bytes(self) -> npt.NDArray[Any]:
        """A host copy of the array, read by one ``copy_dtoh`` of the bytes it spans."""
        lo, hi = span(self._shape, self._strides, self.itemsize)
        raw = np.empty(hi - lo, np.uint8)
        if raw.nbytes:
            self.backend.copy_dtoh(raw, self._ptr + lo)
        if self.is_contiguous:
            return raw.view(self._dtype).reshape(self._shape)
        return np.ndarray(self._shape, self._dtype, buffer=raw, offset=-lo, strides=self._strides).copy()

    def numpy(self, *, copy: bool = True) -> npt.NDArray[Any]:
        """The array's data as a NumPy array.

        Parameters
        ----------
        copy : bool, optional
            True (default): an independent host copy. False: a zero-copy view of the
            memory (only where the backend's memory is host memory, such as the CPU
            backend's; the view keeps the memory alive).

        Raises
        ------
        BufferError
            If ``copy=False`` and the memory is not host-addressable.
        """
        view = self._host_view()
        if view is not None:
            return view.copy() if copy else view
        if not copy:
            raise BufferError(
                f"the {self.backend.name()} backend's memory is not host-addressable; "
                "numpy(copy=False) is only possible where it is (the CPU backend)"
            )
        return self._host_bytes()

    def to_host(self) -> npt.NDArray[Any]:
        """An independent NumPy copy of the data (same as ``numpy()``)."""
        return self.numpy(copy=True)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> npt.NDArray[Any]:
        view = self._host_view()
        if view is None and copy is False:
            raise ValueError(
                f"a DeviceArray on the {self.backend.name()} backend cannot be viewed by NumPy without a copy"
            )
        if view is None:
            result = self._host_bytes()
        else:
            result = view.copy() if copy is True else view
        if dtype is not None and np.dtype(dtype) != result.dtype:
            return result.astype(dtype)
        return result

    def copy_from(self, source: Any) -> None:
        """Overwrite the array's elements with ``source`` (broadcast to the shape, cast to the dtype).

        Works for views and strided arrays too; where the memory is not host memory a
        strided target is updated by a read-modify-write of the bytes it spans.
        """
        self._check_live()
        try:
            data = np.broadcast_to(np.asarray(source, dtype=self._dtype), self._shape)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"cannot write {type(source).__name__} into {self}: {exc}") from exc
        if self.size == 0:
            return
        view = self._host_view()
        if view is not None:
            view[...] = data
            return
        if self.is_contiguous:
            self.backend.copy_htod(self._ptr, np.ascontiguousarray(data).reshape(-1).view(np.uint8))
            return
        lo, hi = span(self._shape, self._strides, self.itemsize)
        raw = np.empty(hi - lo, np.uint8)
        self.backend.copy_dtoh(raw, self._ptr + lo)
        np.ndarray(self._shape, self._dtype, buffer=raw, offset=-lo, strides=self._strides)[...] = data
        self.backend.copy_htod(self._ptr + lo, raw)

    def copy(self) -> DeviceArray:
        """A new C-contiguous array with the same data on the same backend (copied on the device)."""
        from ._movement import ascontiguousarray

        return ascontiguousarray(self, copy=True)

    def to_device(self, backend: ComputeBackend) -> DeviceArray:
        """This array on ``backend``: itself if it is already there, else a copy."""
        if backend is self.backend:
            return self
        from ._create import asarray

        return asarray(self, backend)

    # ------------------------------------------------------------------ DLPack

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)``: the backend's ``dlpack_device()``, or ``(kDLCPU, 0)``
        for backends whose memory leaves the device only by copy (the export is a host copy)."""
        from ._dlpack import dlpack_device_of

        return dlpack_device_of(self.backend)

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
            None: zero-copy where possible (host memory, CUDA memory), else a host
            copy. True: always a copy. False: never copy; raises :class:`BufferError`
            on backends whose memory leaves the device only by copy (OpenCL, wgpu).

        Raises
        ------
        BufferError
            When the request cannot be met (a stream on a backend without streams, an
            unsupported device, ``copy=False`` on a copy-only backend).
        """
        from ._dlpack import export

        return export(self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA Array Interface (version 3) of an array in CUDA / ROCm memory.

        Absent (``AttributeError``) on every other backend. ``stream`` is 1: the backend
        works on the legacy default stream, so consumers order their work after it.
        """
        from ._dlpack import cuda_array_interface

        return cuda_array_interface(self)

    # ------------------------------------------------------------------ operators
    # One backend call each (``broadcast_binary`` when the shapes differ); a Python
    # number operand takes the array's dtype.

    def __matmul__(self, other: DeviceArray) -> DeviceArray:
        from ._linalg import matmul

        return matmul(self, other)

    def __add__(self, other: DeviceArray | float) -> DeviceArray:
        return _binary("add", self, other)

    def __radd__(self, other: float) -> DeviceArray:
        return _binary("add", other, self)

    def __sub__(self, other: DeviceArray | float) -> DeviceArray:
        return _binary("sub", self, other)

    def __rsub__(self, other: float) -> DeviceArray:
        return _binary("sub", other, self)

    def __mul__(self, other: DeviceArray | float) -> DeviceArray:
        return _binary("mul", self, other)

    def __rmul__(self, other: float) -> DeviceArray:
        return _binary("mul", other, self)

    def __truediv__(self, other: DeviceArray | float) -> DeviceArray:
        return _binary("div", self, other)

    def __rtruediv__(self, other: float) -> DeviceArray:
        return _binary("div", other, self)

    def __pow__(self, other: DeviceArray | float) -> DeviceArray:
        return _binary("pow", self, other)

    def __rpow__(self, other: float) -> DeviceArray:
        return _binary("pow", other, self)

    def __neg__(self) -> DeviceArray:
        from ._elementwise import neg

        return neg(self)

    # Arrays compare by identity and are not hashable by value.
    __hash__ = object.__hash__


def _binary(op: str, a: DeviceArray | float, b: DeviceArray | float) -> DeviceArray:
    from ._elementwise import binary

    return binary(op, a, b)

"""Creating arrays: ``empty``, ``zeros``, ``full``, ``asarray`` / ``to_device``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from ..errors import InvalidArgumentError, UnsupportedError
from ._core import DeviceArray
from ._shapes import ShapeLike, as_dtype, as_shape, check_backend

__all__ = ["empty", "zeros", "full", "asarray", "to_device"]


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
    be = check_backend(backend)
    dims = as_shape(shape)
    dt = as_dtype(dtype)
    nbytes = math.prod(dims) * dt.itemsize
    ptr = be.alloc(max(nbytes, dt.itemsize, 1))
    try:
        return DeviceArray._adopt(be, ptr, dims, dt)
    except BaseException:
        be.free(ptr)
        raise


def full(shape: ShapeLike, value: float, backend: ComputeBackend, *, dtype: Any = "float32") -> DeviceArray:
    """A new array of ``value`` on ``backend`` (one ``fill`` call for float dtypes).

    Other dtypes, and backends without ``fill`` for the dtype, get the value by a copy
    from the host.
    """
    out = empty(shape, backend, dtype=dtype)
    if not out.size:
        return out
    try:
        out.backend.fill(out.ptr, out.size, value, dtype=out.dtype)
    except (UnsupportedError, InvalidArgumentError):
        try:
            out.copy_from(np.asarray(value, dtype=out.dtype))
        except BaseException:
            out.free()
            raise
    except BaseException:
        out.free()
        raise
    return out


def zeros(shape: ShapeLike, backend: ComputeBackend, *, dtype: Any = "float32") -> DeviceArray:
    """A new array of zeros on ``backend`` (see :func:`empty`)."""
    return full(shape, 0, backend, dtype=dtype)


def asarray(obj: Any, backend: ComputeBackend, *, dtype: Any = None, copy: bool | None = None) -> DeviceArray:
    """Copy host data (a NumPy array or anything ``numpy.asarray`` accepts) to ``backend``.

    Parameters
    ----------
    obj : array_like or DeviceArray
        The data. A DeviceArray already on ``backend`` with the requested dtype is
        returned as it is unless ``copy=True``; with another dtype it is converted on
        the device where the backend's ``cast`` takes both dtypes; one on another
        backend is transferred.
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
    be = check_backend(backend)
    if isinstance(obj, DeviceArray):
        return _from_array(obj, be, dtype, copy)
    if copy is False:
        raise BufferError("asarray copies host data; use computehal.from_dlpack to borrow it")
    try:
        host = np.asarray(obj, dtype=None if dtype is None else as_dtype(dtype))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"cannot convert {type(obj).__name__} to an array: {exc}") from exc
    return _upload(host, be)


def _from_array(obj: DeviceArray, be: ComputeBackend, dtype: Any, copy: bool | None) -> DeviceArray:
    wanted = obj.dtype if dtype is None else as_dtype(dtype)
    if obj.backend is be and wanted == obj.dtype and copy is not True:
        return obj
    if copy is False:
        raise BufferError("asarray(copy=False) would need a copy of this DeviceArray")
    if obj.backend is be:
        from ._movement import astype, can_cast_on_device

        if wanted == obj.dtype:
            return obj.copy()
        if can_cast_on_device(be, obj.dtype, wanted):
            return astype(obj, wanted)
    host = obj.numpy(copy=False) if obj._host_view() is not None else obj.numpy()
    return _upload(host.astype(wanted, copy=False), be)


def _upload(host: np.ndarray[Any, Any], be: ComputeBackend) -> DeviceArray:
    dt = as_dtype(host.dtype)
    out = empty(host.shape, be, dtype=dt)
    try:
        if host.size:
            be.copy_htod(out.ptr, np.ascontiguousarray(host).reshape(-1).view(np.uint8))
    except BaseException:
        out.free()
        raise
    return out


def to_device(obj: Any, backend: ComputeBackend, *, dtype: Any = None) -> DeviceArray:
    """Alias of :func:`asarray`: move host data (or another backend's array) to ``backend``."""
    return asarray(obj, backend, dtype=dtype)

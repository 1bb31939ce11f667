"""Data movement on the device: contiguous copies, transpose, concatenation, split, expand, cast, take, put.

Every result is a new C-contiguous array written by the backend: one ``copy_strided``
per operand (``copy_dtod`` for a contiguous copy, ``cast`` for a conversion, ``gather``
/ ``scatter`` for rows picked by index). Views that move nothing (``x.T``,
``x[::2]``, ``x.reshape``) are methods of :class:`~computehal.array.DeviceArray`.

Copies are bit copies. Arrays of floating dtypes are copied as themselves; 4- and
8-byte integers as float32 / float64 bit patterns (the backend never computes on them).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from ..dtypes import FLOAT_DTYPES, as_float_dtype
from ..errors import BackendError, InvalidArgumentError, UnsupportedError
from ._checks import arrays, axis_of, contiguous, float_inputs, output, run
from ._core import DeviceArray
from ._create import empty
from ._shapes import as_dtype, as_shape

__all__ = [
    "ascontiguousarray",
    "transpose",
    "permute_dims",
    "concat",
    "split",
    "expand",
    "broadcast_to",
    "astype",
    "take",
    "put",
]

#: Most dimensions a ``copy_strided`` call takes.
MAX_DIMS = 6

_BIT_DTYPES: dict[int, np.dtype[Any]] = {4: np.dtype(np.float32), 8: np.dtype(np.float64)}


def _bit_dtype(dtype: np.dtype[Any]) -> np.dtype[Any] | None:
    """The floating dtype whose elements carry ``dtype``'s bits, or None when there is none."""
    if dtype.name in FLOAT_DTYPES:
        return dtype
    if dtype.kind in "iu" and dtype.itemsize in _BIT_DTYPES:
        return _BIT_DTYPES[dtype.itemsize]
    return None


def _elements(name: str, x: DeviceArray) -> tuple[int, ...]:
    strides = []
    for stride in x.strides:
        if stride % x.itemsize:
            raise InvalidArgumentError(
                f"{name} has a byte stride {stride} that is not a whole number of elements"
            )
        strides.append(stride // x.itemsize)
    return tuple(strides)


def _collapse(
    shape: tuple[int, ...], src: tuple[int, ...], dst: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The same copy with size-1 dimensions dropped and dimensions contiguous in both merged."""
    dims = [(n, s, d) for n, s, d in zip(shape, src, dst, strict=True) if n != 1]
    merged: list[tuple[int, int, int]] = []
    for n, s, d in dims:
        if merged:
            pn, ps, pd = merged[-1]
            if ps == s * n and pd == d * n:
                merged[-1] = (pn * n, s, d)
                continue
        merged.append((n, s, d))
    if not merged:
        merged = [(1, 1, 1)]
    return tuple(m[0] for m in merged), tuple(m[1] for m in merged), tuple(m[2] for m in merged)


def _copy(dst: DeviceArray, src: DeviceArray, *, dtype: np.dtype[Any] | None = None) -> None:
    """``dst[...] = src`` (same shape): one ``copy_strided`` call, ``copy_dtod`` when both are contiguous."""
    if not src.size:
        return
    be = src.backend
    if src.is_contiguous and dst.is_contiguous:
        be.copy_dtod(dst.ptr, src.ptr, src.nbytes)
        return
    bits = dtype or _bit_dtype(src.dtype)
    if bits is None:
        raise UnsupportedError(f"strided copies of {src.dtype} data (no floating type carries its bits)")
    shape, s, d = _collapse(src.shape, _elements("source", src), _elements("destination", dst))
    if len(shape) > MAX_DIMS:
        raise InvalidArgumentError(
            f"this copy needs {len(shape)} strided dimensions; the device copies at most {MAX_DIMS}"
        )
    be.copy_strided(dst.ptr, src.ptr, shape, s, d, dtype=bits)


def ascontiguousarray(x: DeviceArray, *, copy: bool = False) -> DeviceArray:
    """``x`` itself when it is C-contiguous (unless ``copy``), else a C-contiguous copy on its backend.

    One ``copy_dtod`` or ``copy_strided`` call. Where the backend lacks ``copy_strided``
    for the dtype, the copy goes through the host.
    """
    arrays(x=x)
    if x.is_contiguous and not copy:
        return x
    y = empty(x.shape, x.backend, dtype=x.dtype)
    try:
        try:
            _copy(y, x)
        except UnsupportedError:
            y.copy_from(x.numpy())
    except BaseException:
        y.free()
        raise
    return y


def transpose(x: DeviceArray, axes: Sequence[int] | None = None) -> DeviceArray:
    """A C-contiguous copy of ``x`` with its axes permuted (reversed by default); one ``copy_strided``.

    ``x.T`` and ``x.transpose()`` are the views that move nothing; this materialises them.
    """
    arrays(x=x)
    view = x.transpose() if axes is None else x.transpose(*axes)
    y = empty(view.shape, x.backend, dtype=x.dtype)
    return run(y, True, lambda: _copy(y, view))


def permute_dims(x: DeviceArray, axes: Sequence[int]) -> DeviceArray:
    """The array API's name of :func:`transpose` with explicit axes."""
    return transpose(x, axes)


def concat(arrays_: Sequence[DeviceArray], axis: int = 0, *, out: DeviceArray | None = None) -> DeviceArray:
    """Join arrays along an existing axis; one ``copy_strided`` per non-empty input."""
    items = list(arrays_)
    if not items:
        raise InvalidArgumentError("concat needs at least one array")
    arrays(**{f"arrays[{i}]": a for i, a in enumerate(items)}, out=out)
    first = items[0]
    if first.ndim == 0:
        raise InvalidArgumentError("cannot concatenate 0-d arrays")
    ax = axis_of(axis, first.ndim)
    for i, a in enumerate(items):
        if a.dtype != first.dtype:
            raise InvalidArgumentError(f"arrays[{i}] has dtype {a.dtype} but arrays[0] has {first.dtype}")
        if (
            a.ndim != first.ndim
            or a.shape[:ax] + a.shape[ax + 1 :] != first.shape[:ax] + first.shape[ax + 1 :]
        ):
            raise InvalidArgumentError(
                f"arrays[{i}] has shape {a.shape}; it must match {first.shape} except on axis {ax}"
            )
    shape = list(first.shape)
    shape[ax] = sum(a.shape[ax] for a in items)
    y, fresh = output(out, first, tuple(shape), first.dtype)

    def call() -> None:
        at = 0
        for a in items:
            index = [slice(None)] * first.ndim
            index[ax] = slice(at, at + a.shape[ax])
            _copy(y[tuple(index)], a)
            at += a.shape[ax]

    return run(y, fresh, call)


def split(x: DeviceArray, indices_or_sections: int | Sequence[int], axis: int = 0) -> list[DeviceArray]:
    """Split into C-contiguous parts along ``axis`` (NumPy's ``split``); one ``copy_strided`` per part.

    An int asks for that many equal parts (it must divide the axis); a sequence gives
    the indices where parts begin.
    """
    arrays(x=x)
    if x.ndim == 0:
        raise InvalidArgumentError("cannot split a 0-d array")
    ax = axis_of(axis, x.ndim)
    length = x.shape[ax]
    if isinstance(indices_or_sections, Sequence):
        cuts = [operator.index(i) for i in indices_or_sections]
    else:
        sections = operator.index(indices_or_sections)
        if sections < 1 or length % sections:
            raise InvalidArgumentError(f"{sections} equal parts do not divide an axis of length {length}")
        cuts = [length // sections * i for i in range(1, sections)]
    bounds = [0, *(min(max(c if c >= 0 else c + length, 0), length) for c in cuts), length]
    parts: list[DeviceArray] = []
    try:
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            index = [slice(None)] * x.ndim
            index[ax] = slice(lo, max(lo, hi))
            parts.append(ascontiguousarray(x[tuple(index)], copy=True))
    except BaseException:
        for part in parts:
            part.free()
        raise
    return parts


def expand(x: DeviceArray, shape: Sequence[int]) -> DeviceArray:
    """``x`` broadcast to ``shape`` (NumPy's rules) as a new C-contiguous array; one ``copy_strided``.

    The source is read with stride 0 along the broadcast axes.
    """
    arrays(x=x)
    target = as_shape(shape)
    try:
        if tuple(np.broadcast_shapes(x.shape, target)) != target:
            raise ValueError
    except ValueError:
        raise InvalidArgumentError(f"an array of shape {x.shape} cannot be broadcast to {target}") from None
    lead = len(target) - x.ndim
    strides = (0,) * lead + tuple(0 if n == 1 else s for n, s in zip(x.shape, x.strides, strict=True))
    root = x._base if x._base is not None else x
    source = DeviceArray._make(x._holder, x.ptr, target, x.dtype, strides, root)
    y = empty(target, x.backend, dtype=x.dtype)
    return run(y, True, lambda: _copy(y, source))


def broadcast_to(x: DeviceArray, shape: Sequence[int]) -> DeviceArray:
    """Alias of :func:`expand` (the result is a new array, not a view)."""
    return expand(x, shape)


def can_cast_on_device(backend: ComputeBackend, source: np.dtype[Any], target: np.dtype[Any]) -> bool:
    """True when ``backend``'s ``cast`` takes both dtypes."""
    try:
        names = backend.capabilities().dtypes("cast")
    except BackendError:
        return False
    return source.name in names and target.name in names


def astype(x: DeviceArray, dtype: Any, *, out: DeviceArray | None = None) -> DeviceArray:
    """``x`` converted to ``dtype`` (round to nearest-even; out of range to infinity); one ``cast``.

    Both dtypes are floating types the backend's ``cast`` takes
    (``capabilities().dtypes("cast")``).
    """
    src = float_inputs(x=x)
    target = as_float_dtype(as_dtype(dtype), "dtype")
    y, fresh = output(out, x, x.shape, target)
    be = x.backend
    return run(y, fresh, lambda: be.cast(x.ptr, y.ptr, x.size, dtype=src, out_dtype=target))


# --------------------------------------------------------------------------- rows by index


def _rows_of(name: str, x: DeviceArray) -> tuple[int, int]:
    if x.ndim == 0:
        raise InvalidArgumentError(f"{name} needs at least one dimension (rows)")
    return x.shape[0], math.prod(x.shape[1:])


def _index_arguments(indices: Any) -> tuple[Any, dict[str, Any], int]:
    """(the ``indices`` argument, the device-index keywords, the number of indices)."""
    if isinstance(indices, DeviceArray):
        if indices.dtype.name not in ("int32", "int64") or indices.ndim != 1:
            raise InvalidArgumentError(
                f"device indices must be a 1-D int32 or int64 array, got {indices.ndim}-D {indices.dtype}"
            )
        contiguous("indices", indices)
        keywords = {"indices_ptr": indices.ptr, "index_dtype": indices.dtype.name}
        return indices.size, keywords, indices.size
    if isinstance(indices, np.ndarray) and indices.ndim != 1:
        raise InvalidArgumentError(f"indices must be one-dimensional, got {indices.ndim} dimensions")
    try:
        count = len(indices)
    except TypeError:
        raise InvalidArgumentError(
            "indices must be a sequence of integers, an integer array or a DeviceArray, got "
            f"{type(indices).__name__}"
        ) from None
    return indices, {}, count


def _row_dtype(x: DeviceArray) -> np.dtype[Any]:
    bits = _bit_dtype(x.dtype)
    if bits is None:
        raise InvalidArgumentError(f"rows of {x.dtype} data cannot be moved by index on the device")
    return bits


def take(x: DeviceArray, indices: Any, *, out: DeviceArray | None = None) -> DeviceArray:
    """Rows ``x[indices]`` (``gather``); output shape ``(len(indices), *x.shape[1:])``.

    ``indices`` is a host sequence or integer array, or a 1-D int32 / int64
    DeviceArray on the same backend (read and checked on the device). A bad index
    raises :class:`~computehal.InvalidArgumentError` before anything is written.
    """
    arrays(x=x, indices=indices if isinstance(indices, DeviceArray) else None)
    contiguous("x", x)
    rows, cols = _rows_of("x", x)
    argument, keywords, count = _index_arguments(indices)
    y, fresh = output(out, x, (count, *x.shape[1:]), x.dtype)
    be, dt = x.backend, _row_dtype(x)
    return run(y, fresh, lambda: be.gather(x.ptr, argument, y.ptr, rows, cols, dtype=dt, **keywords))


def put(x: DeviceArray, indices: Any, values: DeviceArray) -> DeviceArray:
    """Write ``values`` row ``i`` into row ``indices[i]`` of ``x`` in place (``scatter``); returns ``x``.

    Rows not named keep their values; with duplicate indices the last one wins.
    ``indices`` as for :func:`take`. A bad index raises before anything is written.
    """
    arrays(x=x, values=values, indices=indices if isinstance(indices, DeviceArray) else None)
    contiguous("x", x)
    contiguous("values", values)
    if values.dtype != x.dtype:
        raise InvalidArgumentError(f"values has dtype {values.dtype} but x has {x.dtype}")
    rows, cols = _rows_of("x", x)
    argument, keywords, count = _index_arguments(indices)
    if values.shape != (count, *x.shape[1:]):
        raise InvalidArgumentError(f"values has shape {values.shape}, expected {(count, *x.shape[1:])}")
    x.backend.scatter(values.ptr, argument, x.ptr, rows, cols, dtype=_row_dtype(x), **keywords)
    return x

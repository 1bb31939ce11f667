"""Shapes, strides and indices of arrays: plain arithmetic on tuples, no memory touched."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex

import numpy as np

from ..backend import ComputeBackend
from ..errors import InvalidArgumentError

__all__ = [
    "ShapeLike",
    "as_shape",
    "as_dtype",
    "c_strides",
    "span",
    "check_backend",
    "basic_index",
    "reshaped",
]

ShapeLike = SupportsIndex | Sequence[SupportsIndex]


def as_shape(shape: Any, name: str = "shape") -> tuple[int, ...]:
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


def as_dtype(dtype: Any) -> np.dtype[Any]:
    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"dtype {dtype!r} is not a NumPy dtype") from None
    if dt.hasobject or dt.itemsize == 0:
        raise InvalidArgumentError(f"dtype {dt} has no fixed-size binary representation")
    return dt


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    step = itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def span(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """Byte offsets ``[lo, hi)`` relative to the first element that the array touches."""
    if any(dim == 0 for dim in shape):
        return 0, 0
    lo = sum(min(0, (dim - 1) * st) for dim, st in zip(shape, strides, strict=True))
    hi = sum(max(0, (dim - 1) * st) for dim, st in zip(shape, strides, strict=True)) + itemsize
    return lo, hi


def check_backend(backend: Any) -> ComputeBackend:
    if not isinstance(backend, ComputeBackend):
        raise InvalidArgumentError(f"backend must be a ComputeBackend, got {type(backend).__name__}")
    return backend


def basic_index(
    shape: tuple[int, ...], strides: tuple[int, ...], key: Any
) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """NumPy's basic indexing (integers, slices with any step, ``...``, ``None``) of a strided layout.

    Returns
    -------
    (byte offset, shape, strides) of the view.
    """
    items = list(key) if isinstance(key, tuple) else [key]
    if sum(1 for item in items if item is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(1 for item in items if item is not None and item is not Ellipsis)
    if used > len(shape):
        raise IndexError(f"too many indices: array is {len(shape)}-dimensional, but {used} were indexed")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (len(shape) - used)
    else:
        items.extend([slice(None)] * (len(shape) - used))
    offset = 0
    out_shape: list[int] = []
    out_strides: list[int] = []
    axis = 0
    for item in items:
        if item is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        dim, stride = shape[axis], strides[axis]
        if isinstance(item, slice):
            start, stop, step = item.indices(dim)
            length = len(range(start, stop, step))
            if length:
                offset += start * stride
            out_shape.append(length)
            out_strides.append(stride * step)
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
    return offset, tuple(out_shape), tuple(out_strides)


def reshaped(size: int, shape: tuple[Any, ...]) -> tuple[int, ...]:
    """The shape a reshape of ``size`` elements into ``shape`` gives (one entry may be -1).

    Raises
    ------
    InvalidArgumentError
        If ``shape`` is not a shape, or has another number of elements.
    """
    raw = shape[0] if len(shape) == 1 and not isinstance(shape[0], SupportsIndex) else shape
    dims = list(raw) if isinstance(raw, Iterable) else [raw]
    wanted: list[int] = []
    unknown = -1
    for i, item in enumerate(dims):
        try:
            value = operator.index(item)
        except TypeError:
            raise InvalidArgumentError(f"shape[{i}] must be an integer, got {type(item).__name__}") from None
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
        if known == 0 or size % known:
            raise InvalidArgumentError(f"cannot reshape an array of size {size} into {tuple(dims)}")
        wanted[unknown] = size // known
    new_shape = tuple(wanted)
    if math.prod(new_shape) != size:
        raise InvalidArgumentError(f"cannot reshape an array of size {size} into {new_shape}")
    return new_shape

"""Shared checks of the array functions: operands, dtypes, layouts, output arrays, integer arguments."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..backend import ComputeBackend
from ..dtypes import FLOAT_DTYPES
from ..errors import InvalidArgumentError
from ._core import DeviceArray
from ._create import empty
from ._shapes import as_shape, span

__all__ = [
    "arrays",
    "float_inputs",
    "contiguous",
    "output",
    "run",
    "axis_of",
    "pair",
    "overlap",
    "as_shape",
]


def arrays(**named: Any) -> ComputeBackend:
    """Every operand (None skipped) is a live DeviceArray, all on one backend; that backend."""
    backend: ComputeBackend | None = None
    first = ""
    for name, x in named.items():
        if x is None:
            continue
        if not isinstance(x, DeviceArray):
            raise InvalidArgumentError(f"{name} must be a DeviceArray, got {type(x).__name__}")
        if x.freed:
            raise InvalidArgumentError(f"{name} has been freed")
        if backend is None:
            backend, first = x.backend, name
        elif x.backend is not backend:
            raise InvalidArgumentError(
                f"{name} is on the {x.backend.name()} backend {x.backend!r} but {first} is on "
                f"{backend!r}; move it with to_device() first"
            )
    if backend is None:
        raise InvalidArgumentError("no array operand given")
    return backend


def contiguous(name: str, x: DeviceArray) -> None:
    """``x`` is C-contiguous (InvalidArgumentError otherwise)."""
    if not x.is_contiguous:
        raise InvalidArgumentError(f"{name} must be C-contiguous (strides {x.strides}); copy() it first")


def float_inputs(**named: DeviceArray | None) -> np.dtype[Any]:
    """Live, contiguous operands on one backend, of one floating dtype; that dtype.

    The dtype is passed to the backend as it is: what the device takes is the backend's
    answer (``capabilities().dtypes(op)``; :class:`~computehal.UnsupportedError` otherwise).
    """
    arrays(**named)
    dtype: np.dtype[Any] | None = None
    first = ""
    for name, x in named.items():
        if x is None:
            continue
        if x.dtype.name not in FLOAT_DTYPES:
            raise InvalidArgumentError(
                f"{name} has dtype {x.dtype}; this operation takes {', '.join(FLOAT_DTYPES)}"
            )
        if dtype is None:
            dtype, first = x.dtype, name
        elif x.dtype != dtype:
            raise InvalidArgumentError(f"{name} has dtype {x.dtype} but {first} has {dtype}; cast one first")
        contiguous(name, x)
    assert dtype is not None
    return dtype


def output(
    out: DeviceArray | None, like: DeviceArray, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> tuple[DeviceArray, bool]:
    """The output array (given and checked, or freshly allocated) and whether it is fresh."""
    if out is None:
        return empty(shape, like.backend, dtype=dtype), True
    arrays(out=out, input=like)
    if out.shape != shape:
        raise InvalidArgumentError(f"out has shape {out.shape}, expected {shape}")
    if out.dtype != dtype:
        raise InvalidArgumentError(f"out has dtype {out.dtype}, expected {dtype}")
    contiguous("out", out)
    return out, False


def run(out: DeviceArray, fresh: bool, call: Callable[[], None]) -> DeviceArray:
    """Make the backend call; a freshly allocated output is freed if it fails."""
    try:
        call()
    except BaseException:
        if fresh:
            out.free()
        raise
    return out


def axis_of(axis: object, ndim: int) -> int:
    """``axis`` normalised to ``[0, ndim)`` (negative counts from the end)."""
    if isinstance(axis, bool):
        raise InvalidArgumentError("axis must be an integer, got a bool")
    try:
        ax = operator.index(axis)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"axis must be an integer, got {type(axis).__name__}") from None
    if not -ndim <= ax < ndim:
        raise InvalidArgumentError(f"axis {ax} is out of range for a {ndim}-d array")
    return int(ax % ndim)


def ints(name: str, value: object, count: int | Sequence[int]) -> tuple[int, ...]:
    """``value`` (an int, repeated, or a sequence of ``count`` ints) as a tuple of ints."""
    counts = (count,) if isinstance(count, int) else tuple(count)
    if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
        items = list(value)
    else:
        items = [value] * counts[0]
    if len(items) not in counts:
        wanted = " or ".join(str(c) for c in counts)
        raise InvalidArgumentError(f"{name} must be an integer or {wanted} integers, got {value!r}")
    result = []
    for item in items:
        if isinstance(item, bool):
            raise InvalidArgumentError(f"{name} must contain integers, got a bool")
        try:
            result.append(operator.index(item))
        except TypeError:
            raise InvalidArgumentError(f"{name} must contain integers, got {type(item).__name__}") from None
    return tuple(result)


def pair(name: str, value: object) -> tuple[int, int]:
    """An int (used twice) or a pair of ints."""
    first, second = ints(name, value, 2)
    return first, second


def overlap(x: DeviceArray, y: DeviceArray) -> bool:
    """True when the byte ranges the two arrays span intersect."""
    if not x.size or not y.size:
        return False
    xlo, xhi = span(x.shape, x.strides, x.itemsize)
    ylo, yhi = span(y.shape, y.strides, y.itemsize)
    return x.ptr + xlo < y.ptr + yhi and y.ptr + ylo < x.ptr + xhi

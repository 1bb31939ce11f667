"""Reductions and softmax of arrays: one ``reduce`` or ``softmax`` call each."""

from __future__ import annotations

from ..errors import InvalidArgumentError
from ..types import ReduceOp, coerce_enum
from ._checks import axis_of, float_inputs, output, run
from ._core import DeviceArray

__all__ = ["softmax", "log_softmax", "reduce", "sum", "max", "min", "mean"]


def softmax(x: DeviceArray, axis: int = -1, *, out: DeviceArray | None = None) -> DeviceArray:
    """Numerically stable softmax along ``axis`` (``out`` may be ``x``)."""
    return _softmax(x, axis, False, out)


def log_softmax(x: DeviceArray, axis: int = -1, *, out: DeviceArray | None = None) -> DeviceArray:
    """Log-softmax along ``axis``, ``x - max - log(sum(exp(x - max)))`` (``out`` may be ``x``)."""
    return _softmax(x, axis, True, out)


def _softmax(x: DeviceArray, axis: int, log: bool, out: DeviceArray | None) -> DeviceArray:
    dt = float_inputs(x=x)
    if x.ndim == 0:
        raise InvalidArgumentError("softmax needs at least one dimension")
    ax = axis_of(axis, x.ndim)
    y, fresh = output(out, x, x.shape, dt)
    be = x.backend
    return run(y, fresh, lambda: be.softmax(x.ptr, y.ptr, x.shape, ax, dtype=dt, log=log))


def reduce(
    op: ReduceOp | str,
    x: DeviceArray,
    axis: int | None = None,
    *,
    keepdims: bool = False,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Reduce an array with ``op`` (sum, max, min, mean) along ``axis``.

    ``axis=None`` reduces every element (the contiguous array is viewed as 1-D).
    MAX / MIN ignore NaN; an empty axis gives 0 (sum, mean), -inf (max), +inf (min).
    """
    rop = coerce_enum(ReduceOp, op, "op")
    dt = float_inputs(x=x)
    if axis is None:
        shape_in, ax = [x.size], 0
        shape_out: tuple[int, ...] = (1,) * x.ndim if keepdims else ()
    else:
        if x.ndim == 0:
            raise InvalidArgumentError("cannot reduce a 0-d array along an axis")
        ax = axis_of(axis, x.ndim)
        shape_in = list(x.shape)
        kept = (
            [1 if i == ax else d for i, d in enumerate(x.shape)]
            if keepdims
            else [d for i, d in enumerate(x.shape) if i != ax]
        )
        shape_out = tuple(kept)
    y, fresh = output(out, x, shape_out, dt)
    be = x.backend
    return run(y, fresh, lambda: be.reduce(rop, x.ptr, y.ptr, shape_in, ax, dtype=dt))


def sum(  # noqa: A001 - NumPy's name
    x: DeviceArray, axis: int | None = None, *, keepdims: bool = False, out: DeviceArray | None = None
) -> DeviceArray:
    """Sum along ``axis`` (all elements when None); see :func:`reduce`."""
    return reduce(ReduceOp.SUM, x, axis, keepdims=keepdims, out=out)


def max(  # noqa: A001 - NumPy's name
    x: DeviceArray, axis: int | None = None, *, keepdims: bool = False, out: DeviceArray | None = None
) -> DeviceArray:
    """Maximum along ``axis``, ignoring NaN; see :func:`reduce`."""
    return reduce(ReduceOp.MAX, x, axis, keepdims=keepdims, out=out)


def min(  # noqa: A001 - NumPy's name
    x: DeviceArray, axis: int | None = None, *, keepdims: bool = False, out: DeviceArray | None = None
) -> DeviceArray:
    """Minimum along ``axis``, ignoring NaN; see :func:`reduce`."""
    return reduce(ReduceOp.MIN, x, axis, keepdims=keepdims, out=out)


def mean(
    x: DeviceArray, axis: int | None = None, *, keepdims: bool = False, out: DeviceArray | None = None
) -> DeviceArray:
    """Mean along ``axis``; see :func:`reduce`."""
    return reduce(ReduceOp.MEAN, x, axis, keepdims=keepdims, out=out)

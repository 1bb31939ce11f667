"""Operations along an axis: reduce, softmax, layer / RMS / batch normalisation, LRN."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from ..errors import InvalidArgumentError
from ..memory import Lease, Region, as_count, as_pointer
from ..types import ReduceOp, coerce_enum
from ._core import Operand, Problem, Role, as_finite, as_flag, as_shape, float_dtype, record

__all__ = [
    "AxisProblem",
    "NormProblem",
    "BatchNormProblem",
    "LrnProblem",
    "reduce",
    "softmax",
    "layer_norm",
    "rms_norm",
    "batch_norm",
    "lrn",
]

_IO = (Operand("input", Role.IN), Operand("output", Role.OUT))
_EMPTY_AXIS = {ReduceOp.SUM: 0.0, ReduceOp.MEAN: 0.0, ReduceOp.MAX: -math.inf, ReduceOp.MIN: math.inf}


@record
class AxisProblem(Problem):
    """A validated reduce or softmax over ``axis`` of a row-major tensor.

    The tensor is viewed as ``[outer, length, inner]`` with ``length`` the size of
    ``axis``. ``op`` is the reduction (``None`` for softmax; ``log`` selects log-softmax).
    """

    OPERANDS: ClassVar[tuple[Operand, ...]] = _IO

    shape: tuple[int, ...]
    axis: int
    outer: int
    length: int
    inner: int
    input: Region
    output: Region
    op: ReduceOp | None
    dtype: np.dtype[Any]
    log: bool = False

    def constant_output(self) -> tuple[Region, float] | None:
        """A reduction over a zero-length axis: 0 (SUM, MEAN), -inf (MAX), +inf (MIN)."""
        if self.op is not None and self.length == 0:
            return (self.output, _EMPTY_AXIS[self.op])
        return None


def _axis(
    lease: Lease,
    op: ReduceOp | None,
    input_ptr: object,
    output_ptr: object,
    shape: object,
    axis: object,
    dtype: object,
) -> AxisProblem:
    dt = float_dtype(dtype)
    dims = as_shape("shape", shape)
    if not dims:
        raise InvalidArgumentError("shape must have at least one dimension")
    ax = as_count("axis", axis)
    if ax >= len(dims):
        raise InvalidArgumentError(f"axis {ax} is out of range for a {len(dims)}-d shape {list(dims)}")
    src, dst = as_pointer("input_ptr", input_ptr), as_pointer("output_ptr", output_ptr)
    outer, length, inner = math.prod(dims[:ax]), dims[ax], math.prod(dims[ax + 1 :])
    size = dt.itemsize
    in_bytes = outer * length * inner * size
    out_bytes = outer * inner * size if op is not None else in_bytes
    x = lease.resolve("input_ptr", src, in_bytes, align=size)
    y = lease.resolve("output_ptr", dst, out_bytes, align=size)
    return AxisProblem(dims, ax, outer, length, inner, x, y, op, dt)


def reduce(
    lease: Lease,
    op: object,
    input_ptr: object,
    output_ptr: object,
    shape: object,
    axis: object,
    *,
    dtype: object = "float32",
) -> AxisProblem:
    """Validate ``reduce``."""
    return _axis(lease, coerce_enum(ReduceOp, op, "op"), input_ptr, output_ptr, shape, axis, dtype)


def softmax(
    lease: Lease,
    input_ptr: object,
    output_ptr: object,
    shape: object,
    axis: object,
    *,
    dtype: object = "float32",
    log: object = False,
) -> AxisProblem:
    """Validate ``softmax`` (and log-softmax with ``log=True``)."""
    is_log = as_flag("log", log)
    p = _axis(lease, None, input_ptr, output_ptr, shape, axis, dtype)
    return replace(p, log=True) if is_log else p


# --------------------------------------------------------------------------- row normalisation


@record
class NormProblem(Problem):
    """A validated ``layer_norm`` (``rms`` False) or ``rms_norm`` over rows of ``cols``."""

    OPERANDS: ClassVar[tuple[Operand, ...]] = (
        Operand("input", Role.IN),
        Operand("scale", Role.IN),
        Operand("bias", Role.IN),
        Operand("output", Role.OUT),
    )

    rms: bool
    rows: int
    cols: int
    eps: float
    input: Region
    output: Region
    scale: Region | None
    bias: Region | None
    dtype: np.dtype[Any]


def _eps(eps: object) -> float:
    e = as_finite("eps", eps)
    if e < 0:
        raise InvalidArgumentError(f"eps must be >= 0, got {e}")
    return e


def _channel_shape(shape: object) -> tuple[tuple[int, ...], int, int, int]:
    """``shape`` (N, C, ...) checked, with N, C and the product of the remaining dimensions."""
    dims = as_shape("shape", shape)
    if len(dims) < 2:
        raise InvalidArgumentError(f"shape must have at least 2 dimensions (N, C, ...), got {list(dims)}")
    return dims, dims[0], dims[1], math.prod(dims[2:])


def _norm(
    lease: Lease,
    rms: bool,
    input_ptr: object,
    output_ptr: object,
    rows: object,
    cols: object,
    eps: object,
    scale_ptr: object,
    bias_ptr: object,
    dtype: object,
) -> NormProblem:
    dt = float_dtype(dtype)
    r, c = as_count("rows", rows), as_count("cols", cols)
    e = _eps(eps)
    src, dst = as_pointer("input_ptr", input_ptr), as_pointer("output_ptr", output_ptr)
    sp = None if scale_ptr is None else as_pointer("scale_ptr", scale_ptr)
    bp = None if bias_ptr is None else as_pointer("bias_ptr", bias_ptr)
    size = dt.itemsize
    x = lease.resolve("input_ptr", src, r * c * size, align=size)
    y = lease.resolve("output_ptr", dst, r * c * size, align=size)
    s = None if sp is None else lease.resolve("scale_ptr", sp, c * size, align=size)
    b = None if bp is None else lease.resolve("bias_ptr", bp, c * size, align=size)
    return NormProblem(rms, r, c, e, x, y, s, b, dt)


def layer_norm(
    lease: Lease,
    input_ptr: object,
    output_ptr: object,
    rows: object,
    cols: object,
    eps: object,
    *,
    scale_ptr: object = None,
    bias_ptr: object = None,
    dtype: object = "float32",
) -> NormProblem:
    """Validate ``layer_norm``."""
    return _norm(lease, False, input_ptr, output_ptr, rows, cols, eps, scale_ptr, bias_ptr, dtype)


def rms_norm(
    lease: Lease,
    input_ptr: object,
    output_ptr: object,
    rows: object,
    cols: object,
    eps: object,
    *,
    scale_ptr: object = None,
    bias_ptr: object = None,
    dtype: object = "float32",
) -> NormProblem:
    """Validate ``rms_norm``."""
    return _norm(lease, True, input_ptr, output_ptr, rows, cols, eps, scale_ptr, bias_ptr, dtype)


# --------------------------------------------------------------------------- channel normalisation


@record
class BatchNormProblem(Problem):
    """A validated inference ``batch_norm``: input viewed as [n, c, spatial], channel axis 1."""

    OPERANDS: ClassVar[tuple[Operand, ...]] = (
        Operand("input", Role.IN),
        Operand("scale", Role.IN),
        Operand("bias", Role.IN),
        Operand("mean", Role.IN),
        Operand("var", Role.IN),
        Operand("output", Role.OUT),
    )

    shape: tuple[int, ...]
    n: int
    c: int
    spatial: int
    eps: float
    input: Region
    scale: Region
    bias: Region
    mean: Region
    var: Region
    output: Region
    dtype: np.dtype[Any]


def batch_norm(
    lease: Lease,
    input_ptr: object,
    shape: object,
    scale_ptr: object,
    bias_ptr: object,
    mean_ptr: object,
    var_ptr: object,
    output_ptr: object,
    eps: object,
    *,
    dtype: object = "float32",
) -> BatchNormProblem:
    """Validate ``batch_norm``."""
    dt = float_dtype(dtype)
    dims, n, c, spatial = _channel_shape(shape)
    e = _eps(eps)
    names = ("input_ptr", "scale_ptr", "bias_ptr", "mean_ptr", "var_ptr", "output_ptr")
    given = (input_ptr, scale_ptr, bias_ptr, mean_ptr, var_ptr, output_ptr)
    ptrs = [as_pointer(name, p) for name, p in zip(names, given, strict=True)]
    size = dt.itemsize
    total = n * c * spatial * size
    x = lease.resolve("input_ptr", ptrs[0], total, align=size)
    s, b, m, v = (lease.resolve(names[i], ptrs[i], c * size, align=size) for i in range(1, 5))
    y = lease.resolve("output_ptr", ptrs[5], total, align=size)
    return BatchNormProblem(dims, n, c, spatial, e, x, s, b, m, v, y, dt)


@record
class LrnProblem(Problem):
    """A validated ``lrn`` (ONNX's LRN across channels): input viewed as [n, c, spatial].

    ``y = x / (bias + alpha / size * sum(x[c'] ** 2)) ** beta`` with ``c'`` from
    ``c - (size - 1) // 2`` to ``c + size // 2`` (clipped to the channels).
    """

    OPERANDS: ClassVar[tuple[Operand, ...]] = _IO

    shape: tuple[int, ...]
    n: int
    c: int
    spatial: int
    size: int
    alpha: float
    beta: float
    bias: float
    input: Region
    output: Region
    dtype: np.dtype[Any]


def lrn(
    lease: Lease,
    input_ptr: object,
    output_ptr: object,
    shape: object,
    size: object,
    alpha: object,
    beta: object,
    bias: object,
    *,
    dtype: object = "float32",
) -> LrnProblem:
    """Validate ``lrn``."""
    dt = float_dtype(dtype)
    dims, n, c, spatial = _channel_shape(shape)
    window = as_count("size", size)
    if window < 1:
        raise InvalidArgumentError(f"size must be >= 1, got {window}")
    al, be, bi = as_finite("alpha", alpha), as_finite("beta", beta), as_finite("bias", bias)
    src, dst = as_pointer("input_ptr", input_ptr), as_pointer("output_ptr", output_ptr)
    isz = dt.itemsize
    x = lease.resolve("input_ptr", src, n * c * spatial * isz, align=isz)
    y = lease.resolve("output_ptr", dst, n * c * spatial * isz, align=isz)
    return LrnProblem(dims, n, c, spatial, window, al, be, bi, x, y, dt)

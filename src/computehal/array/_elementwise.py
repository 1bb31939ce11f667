"""Element-wise functions of arrays: one ``unary``, ``binary`` or ``broadcast_binary`` call each.

Binary functions broadcast with NumPy's rules: operands of one shape go to the seed's
``binary``, others to ``broadcast_binary``. A Python number operand becomes a one-element
array of the other operand's dtype first (one ``fill``). There is no type promotion:
both arrays must have one floating dtype, which is passed to the backend as it is.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..types import BinaryOp, UnaryOp, coerce_enum
from ._checks import float_inputs, output, run
from ._core import DeviceArray
from ._create import full

__all__ = [
    "unary",
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "sqrt",
    "abs",
    "neg",
    "gelu",
    "silu",
    "erf",
    "reciprocal",
    "square",
    "sin",
    "cos",
    "leaky_relu",
    "clip",
    "binary",
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "maximum",
    "minimum",
]

Operand = DeviceArray | float


def unary(
    op: UnaryOp | str,
    x: DeviceArray,
    *,
    alpha: float | None = None,
    lo: float | None = None,
    hi: float | None = None,
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Apply a :class:`~computehal.UnaryOp` to every element (``out`` may be ``x``).

    ``alpha`` is LEAKY_RELU's slope, ``lo`` / ``hi`` CLIP's bounds.
    """
    uop = coerce_enum(UnaryOp, op, "op")
    dt = float_inputs(x=x)
    y, fresh = output(out, x, x.shape, dt)
    be = x.backend
    return run(y, fresh, lambda: be.unary(uop, x.ptr, y.ptr, x.size, dtype=dt, alpha=alpha, lo=lo, hi=hi))


def relu(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``max(x, 0)`` (NaN gives 0)."""
    return unary(UnaryOp.RELU, x, out=out)


def sigmoid(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``1 / (1 + exp(-x))``."""
    return unary(UnaryOp.SIGMOID, x, out=out)


def tanh(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """Hyperbolic tangent."""
    return unary(UnaryOp.TANH, x, out=out)


def exp(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``e ** x``."""
    return unary(UnaryOp.EXP, x, out=out)


def log(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """Natural logarithm."""
    return unary(UnaryOp.LOG, x, out=out)


def sqrt(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """Square root."""
    return unary(UnaryOp.SQRT, x, out=out)


def abs(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:  # noqa: A001 - NumPy's name
    """Absolute value."""
    return unary(UnaryOp.ABS, x, out=out)


def neg(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``-x``."""
    return unary(UnaryOp.NEG, x, out=out)


def gelu(x: DeviceArray, *, approximate: str = "none", out: DeviceArray | None = None) -> DeviceArray:
    """GELU: ``x * Phi(x)`` (erf form), or its tanh approximation with ``approximate="tanh"``."""
    if approximate not in ("none", "tanh"):
        raise InvalidArgumentError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return unary(UnaryOp.GELU_TANH if approximate == "tanh" else UnaryOp.GELU, x, out=out)


def silu(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``x * sigmoid(x)``."""
    return unary(UnaryOp.SILU, x, out=out)


def erf(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """The error function."""
    return unary(UnaryOp.ERF, x, out=out)


def reciprocal(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``1 / x``."""
    return unary(UnaryOp.RECIPROCAL, x, out=out)


def square(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """``x * x``."""
    return unary(UnaryOp.SQUARE, x, out=out)


def sin(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """Sine."""
    return unary(UnaryOp.SIN, x, out=out)


def cos(x: DeviceArray, *, out: DeviceArray | None = None) -> DeviceArray:
    """Cosine."""
    return unary(UnaryOp.COS, x, out=out)


def leaky_relu(x: DeviceArray, alpha: float = 0.01, *, out: DeviceArray | None = None) -> DeviceArray:
    """``x`` where ``x >= 0``, else ``alpha * x``."""
    return unary(UnaryOp.LEAKY_RELU, x, alpha=alpha, out=out)


def clip(
    x: DeviceArray, lo: float | None = None, hi: float | None = None, *, out: DeviceArray | None = None
) -> DeviceArray:
    """``min(max(x, lo), hi)`` (a missing bound is no bound)."""
    return unary(UnaryOp.CLIP, x, lo=lo, hi=hi, out=out)


# --------------------------------------------------------------------------- binary


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def binary(op: BinaryOp | str, a: Operand, b: Operand, *, out: DeviceArray | None = None) -> DeviceArray:
    """Apply a :class:`~computehal.BinaryOp` element-wise with NumPy broadcasting.

    Operands of one shape make one ``binary`` call, others one ``broadcast_binary``
    call (up to 6 dimensions); ``out`` may be an operand. One operand may be a Python
    number.
    """
    bop = coerce_enum(BinaryOp, op, "op")
    if _is_number(a) and isinstance(b, DeviceArray):
        with _scalar(a, b) as sa:
            return binary(bop, sa, b, out=out)
    if _is_number(b) and isinstance(a, DeviceArray):
        with _scalar(b, a) as sb:
            return binary(bop, a, sb, out=out)
    if not isinstance(a, DeviceArray) or not isinstance(b, DeviceArray):
        raise InvalidArgumentError(
            f"binary operands must be DeviceArrays or numbers, got {type(a).__name__} and {type(b).__name__}"
        )
    dt = float_inputs(a=a, b=b)
    try:
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise InvalidArgumentError(f"shapes {a.shape} and {b.shape} do not broadcast together") from None
    y, fresh = output(out, a, shape, dt)
    be = a.backend
    if a.shape == b.shape:
        return run(y, fresh, lambda: be.binary(bop, a.ptr, b.ptr, y.ptr, y.size, dtype=dt))
    a_shape, b_shape = a.shape or (1,), b.shape or (1,)
    return run(
        y,
        fresh,
        lambda: be.broadcast_binary(bop, a.ptr, a_shape, b.ptr, b_shape, y.ptr, shape or (1,), dtype=dt),
    )


def _scalar(value: Any, like: DeviceArray) -> DeviceArray:
    """A 0-d array holding ``value`` in ``like``'s dtype on its backend (freed on leaving ``with``)."""
    return full((), float(value), like.backend, dtype=like.dtype)


def add(a: Operand, b: Operand, *, out: DeviceArray | None = None) -> DeviceArray:
    """``a + b`` (broadcasting)."""
    return binary(BinaryOp.ADD, a, b, out=out)


def sub(a: Operand, b: Operand, *, out: DeviceArray | None = None) -> DeviceArray:
    """``a - b`` (broadcasting)."""
    return binary(BinaryOp.SUB, a, b, out=out)


def mul(a: Operand, b: Operand, *, out: DeviceArray | None = None) -> DeviceArray:
    """``a * b`` (broadcasting)."""
    return binary(BinaryOp.MUL, a, b, out=out)


def div(a: Operand, b: Operand, *, out: DeviceArray | None = None) -> DeviceArray:
    """``a / b`` (IEEE: x/0 is inf, 0/0 is NaN; broadcasting)."""
    return binary(BinaryOp.DIV, a, b, out=out)


def pow(a: Operand, b: Operand, *, out: DeviceArray | None = None) -> DeviceArray:  # noqa: A001 - NumPy's name
    """``a ** b`` (C's ``pow``; broadcasting)."""
    return binary(BinaryOp.POW, a, b, out=out)


def maximum(a: Operand, b: Operand, *, out: DeviceArray | None = None) -> DeviceArray:
    """Element-wise maximum, ignoring NaN (like ``numpy.fmax``; broadcasting)."""
    return binary(BinaryOp.MAX, a, b, out=out)


def minimum(a: Operand, b: Operand, *, out: DeviceArray | None = None) -> DeviceArray:
    """Element-wise minimum, ignoring NaN (like ``numpy.fmin``; broadcasting)."""
    return binary(BinaryOp.MIN, a, b, out=out)

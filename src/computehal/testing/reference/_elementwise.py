"""Element-wise definitions: unary and binary functions, broadcasting, dtype conversion."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ._rounding import F64Array, round_to

__all__ = ["unary", "binary", "broadcast_binary", "cast", "UNARY_DEFINITIONS"]

_SQRT1_2 = math.sqrt(0.5)
_GELU_TANH_C = math.sqrt(2.0 / math.pi)


def _f64(x: npt.ArrayLike) -> F64Array:
    return np.asarray(x, dtype=np.float64)


def _each(function: Callable[[float], float]) -> Callable[[F64Array], F64Array]:
    def apply(x: F64Array) -> F64Array:
        return np.array([function(float(v)) for v in x.reshape(-1)], dtype=np.float64).reshape(x.shape)

    return apply


_erf = _each(math.erf)
_erfc = _each(math.erfc)


def _gelu(x: F64Array) -> F64Array:
    # x * Phi(x) through erfc, which keeps its accuracy where 1 + erf(x / sqrt 2) cancels.
    # At -inf this is -inf * 0 = NaN, as the erf form evaluated in IEEE arithmetic gives.
    return x * (0.5 * _erfc(-x * _SQRT1_2))


def _gelu_tanh(x: F64Array) -> F64Array:
    return 0.5 * x * (1.0 + np.tanh(_GELU_TANH_C * (x + 0.044715 * x * x * x)))


def _silu(x: F64Array) -> F64Array:
    return x / (1.0 + np.exp(-x))


#: Every unary function by its ``UnaryOp`` value (LEAKY_RELU and CLIP take parameters).
UNARY_DEFINITIONS: dict[str, Callable[[F64Array], F64Array]] = {
    "relu": lambda x: np.where(x > 0, x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "neg": np.negative,
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "silu": _silu,
    "erf": _erf,
    "reciprocal": lambda x: 1.0 / x,
    "square": lambda x: x * x,
    "sin": np.sin,
    "cos": np.cos,
}


def unary(
    op: str,
    x: npt.ArrayLike,
    *,
    alpha: float | None = None,
    lo: float | None = None,
    hi: float | None = None,
) -> F64Array:
    """Element-wise ``op`` in float64.

    RELU maps NaN to 0; LOG / SQRT of negatives give NaN; everything else is its formula
    in IEEE arithmetic (NaN in, NaN out; GELU, GELU_TANH and SILU of -inf are NaN,
    ``-inf * 0``). LEAKY_RELU is ``x`` if ``x >= 0`` else ``alpha * x`` (default 0.01);
    CLIP is ``min(max(x, lo), hi)`` with NaN kept (defaults -inf / +inf).
    """
    x64 = _f64(x)
    with np.errstate(all="ignore"):
        if op == "leaky_relu":
            slope = 0.01 if alpha is None else alpha
            return np.where(x64 >= 0, x64, slope * x64)
        if op == "clip":
            low = -np.inf if lo is None else lo
            high = np.inf if hi is None else hi
            return np.where(np.isnan(x64), np.nan, np.minimum(np.maximum(x64, low), high))
        if op in UNARY_DEFINITIONS:
            return _f64(UNARY_DEFINITIONS[op](x64))
    raise ValueError(f"unknown unary op {op!r}")


def binary(op: str, a: npt.ArrayLike, b: npt.ArrayLike) -> F64Array:
    """Element-wise ``op`` in float64.

    MAX / MIN return the other operand when one is NaN (``fmax`` / ``fmin``); DIV is
    IEEE division; POW is C's ``pow`` (``pow(x, 0) == 1`` and ``pow(1, y) == 1`` even
    for NaN, a negative base with a non-integer exponent gives NaN).
    """
    a64, b64 = _f64(a), _f64(b)
    with np.errstate(all="ignore"):
        if op == "add":
            return a64 + b64
        if op == "sub":
            return a64 - b64
        if op == "mul":
            return a64 * b64
        if op == "div":
            return a64 / b64
        if op == "pow":
            return _f64(np.power(a64, b64))
        if op in ("max", "min"):
            pick = a64 > b64 if op == "max" else a64 < b64
            out = np.where(pick, a64, b64)
            out = np.where(np.isnan(a64), b64, out)
            return np.where(np.isnan(b64), a64, out)
    raise ValueError(f"unknown binary op {op!r}")


def broadcast_binary(op: str, a: npt.ArrayLike, b: npt.ArrayLike) -> F64Array:
    """:func:`binary` after NumPy broadcasting of ``a`` and ``b`` (arrays of their shapes)."""
    a64, b64 = np.broadcast_arrays(_f64(a), _f64(b))
    return binary(op, a64, b64)


def cast(x: npt.ArrayLike, out_dtype: Any) -> F64Array:
    """``x`` converted to ``out_dtype``: nearest even, overflow to infinity, NaN kept."""
    return round_to(x, out_dtype)

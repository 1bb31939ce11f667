"""Compiled activation kernels of the CPU backend (numba): GELU, SiLU, erf, leaky ReLU, clip.

Each kernel is one pass over memory with branch-free arithmetic, so LLVM vectorises it.
The float32 transcendentals come from :mod:`._kmath` (tanh, sigmoid); erf is a rational
approximation ``x * N(x**2) / D(x**2)`` on ``[-4, 4]`` (beyond, erf is +-1 in float32)
fitted to a relative error of 8.4e-8 and evaluated in float64, so the float32 result
is within 2 ULP (checked by ``tests/test_cpu_kernels.py``). ``leaky_relu_into`` and
``clip_into`` take float32 or float64; the others float32. ``out`` may be ``x``.
NaN in gives NaN out; the formulas are the contract's, so ``x = -inf`` gives NaN for
GELU and SiLU (``-inf * 0``), as their definitions do.
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._kmath import _sigmoid, _tanh
from ._nb import jit

__all__ = ["erf_into", "gelu_into", "gelu_tanh_into", "silu_into", "leaky_relu_into", "clip_into", "warm_up"]

# erf(x) ~ x * N(t) / D(t), t = x * x, for |x| <= 4 (D's constant term is 1).
_N0 = 1.1283791585725593
_N1 = 0.18969104208315593
_N2 = 0.05263728412847228
_N3 = 0.0037318730185082623
_N4 = 0.0002835319351840154
_N5 = 2.046421129052816e-06
_D1 = 0.5014422221259409
_D2 = 0.1137984160684458
_D3 = 0.01490017760068615
_D4 = 0.0011533854239571344
_D5 = 3.7986715602438314e-05
_SQRT_HALF = 1.0 / math.sqrt(2.0)
_TANH_K = np.float32(math.sqrt(2.0 / math.pi))
_TANH_C = np.float32(0.044715)
_F = np.float32


_jit = jit


@_jit
def _erf64(x: float) -> float:
    """erf of a float64 (from a float32), accurate to float32; NaN stays NaN."""
    c = 4.0 if x > 4.0 else x
    c = -4.0 if c < -4.0 else c
    t = c * c
    num = ((((_N5 * t + _N4) * t + _N3) * t + _N2) * t + _N1) * t + _N0
    den = ((((_D5 * t + _D4) * t + _D3) * t + _D2) * t + _D1) * t + 1.0
    r = c * num / den
    r = 1.0 if r > 1.0 else r
    return -1.0 if r < -1.0 else r


@_jit
def erf_into(x: Any, out: Any) -> None:
    """``out[i] = erf(x[i])`` for 1-D float32 arrays."""
    for i in range(x.shape[0]):
        out[i] = _erf64(np.float64(x[i]))


@_jit
def gelu_into(x: Any, out: Any) -> None:
    """``out[i] = 0.5 * x * (1 + erf(x / sqrt(2)))`` for 1-D float32 arrays."""
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        out[i] = 0.5 * v * (1.0 + _erf64(v * _SQRT_HALF))


@_jit
def gelu_tanh_into(x: Any, out: Any) -> None:
    """``out[i] = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``, float32."""
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = _F(0.5) * v * (_F(1.0) + _tanh(_TANH_K * (v + _TANH_C * v * v * v)))


@_jit
def silu_into(x: Any, out: Any) -> None:
    """``out[i] = x * sigmoid(x)`` for 1-D float32 arrays."""
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = v * _sigmoid(v)


@_jit
def leaky_relu_into(x: Any, out: Any, alpha: Any) -> None:
    """``out[i] = x if x >= 0 else alpha * x`` (``alpha`` a 1-element array of the data's type)."""
    a = alpha[0]
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = v if v >= 0 else a * v


@_jit
def clip_into(x: Any, out: Any, bounds: Any) -> None:
    """``out[i] = min(max(x, lo), hi)`` with NaN propagated (``bounds`` = [lo, hi] of the data's type)."""
    lo, hi = bounds[0], bounds[1]
    for i in range(x.shape[0]):
        v = x[i]
        v = lo if v < lo else v
        out[i] = hi if v > hi else v


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel."""
    for dtype in (np.float32, np.float64):
        a = np.zeros(4, dtype=dtype)
        leaky_relu_into(a, a, np.ones(1, dtype=dtype))
        clip_into(a, a, np.ones(2, dtype=dtype))
    a = np.zeros(4, dtype=np.float32)
    for fn in (erf_into, gelu_into, gelu_tanh_into, silu_into):
        fn(a, a)

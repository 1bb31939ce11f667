"""Compiled activation kernels of the CPU backend (numba): GELU, SiLU, erf, leaky ReLU, clip.

Each kernel is one pass over memory with branch-free arithmetic, vectorised with the
CPU's widest vectors (:func:`._nb.wide_vectors`). The float32 transcendentals come from
:mod:`._kmath` (exp, tanh, sigmoid); erf is a rational approximation
``x * N(x**2) / D(x**2)`` on ``[-4, 4]`` (beyond, erf is +-1 in float32) fitted to a
relative error of 8.4e-8. ``erf_into`` evaluates it in float64 (within 2 ULP of erf,
checked by ``tests/test_cpu_kernels.py``); GELU evaluates it in float32 (all
coefficients positive, so Horner's rule loses a few units of 2**-24 at most: GELU's
``Phi`` stays within 4 units of float32's epsilon, absolutely). GELU_TANH uses
``(1 + tanh(u)) / 2 = 1 / (1 + exp(-2 u))``: one exponential and one division.
``leaky_relu_into`` and ``clip_into`` take float32 or float64; the others float32.
``out`` may be ``x``. NaN in gives NaN out; ``x = -inf`` gives NaN for GELU, GELU_TANH
and SiLU (``-inf * 0``, ``-inf / inf``), as their definitions do.

With ``stream`` set, the float32 kernels write through :mod:`._kwrite`'s non-temporal
stores: memory then sees one read and one write per element, not the extra read of
each output line that an ordinary store costs.
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._kmath import _HALF, _ONE, _TWO, _exp, _log, _sigmoid, _tanh
from ._kwrite import BLOCK, store_fence, stream_block, stream_head
from ._nb import jit, wide_vectors

__all__ = [
    "erf_into",
    "gelu_into",
    "gelu_tanh_into",
    "silu_into",
    "sigmoid_into",
    "tanh_into",
    "exp_into",
    "log_into",
    "leaky_relu_into",
    "clip_into",
    "warm_up",
]

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
def _erf_of(v: float) -> float:
    return _F(_erf64(np.float64(v)))


_F32_N = tuple(_F(c) for c in (_N0, _N1, _N2, _N3, _N4, _N5))
_F32_D = tuple(_F(c) for c in (_D1, _D2, _D3, _D4, _D5))
_F_SQRT_HALF = _F(_SQRT_HALF)
_F_FOUR = _F(4.0)


@_jit
def _erf32(x: float) -> float:
    """erf of a float32 in float32 arithmetic (absolute error a few units of 2**-24); NaN stays NaN."""
    c = _F_FOUR if x > _F_FOUR else x
    c = -_F_FOUR if c < -_F_FOUR else c
    t = c * c
    n0, n1, n2, n3, n4, n5 = _F32_N
    d1, d2, d3, d4, d5 = _F32_D
    num = ((((n5 * t + n4) * t + n3) * t + n2) * t + n1) * t + n0
    den = ((((d5 * t + d4) * t + d3) * t + d2) * t + d1) * t + _ONE
    r = c * num / den
    r = _ONE if r > _ONE else r
    return -_ONE if r < -_ONE else r


@_jit
def _gelu(v: float) -> float:
    return _HALF * v * (_ONE + _erf32(v * _F_SQRT_HALF))


@_jit
def _gelu_tanh(v: float) -> float:
    # 0.5 v (1 + tanh(u)) = v / (1 + exp(-2u)); exp overflows to inf for u << 0 (v / inf = -0).
    u = _TANH_K * (v + _TANH_C * v * v * v)
    return v / (_ONE + _exp(-_TWO * u))


@_jit
def _silu(v: float) -> float:
    return v * _sigmoid(v)


# One kernel per function (numba cannot cache a kernel that takes a function argument),
# each ``out[i] = f(x[i])`` for 1-D float32 arrays, streamed as :mod:`._kwrite` says
# (without ``stream`` all of ``x`` is the head: one vectorised loop).


@_jit
def gelu_into(x: Any, out: Any, stream: bool = False) -> None:
    """``out[i] = 0.5 * x * (1 + erf(x / sqrt(2)))`` for 1-D float32 arrays."""
    wide_vectors()
    n = x.shape[0]
    head = stream_head(out, stream)
    for i in range(head):
        out[i] = _gelu(x[i])
    buf = np.empty(BLOCK if head < n else 0, dtype=np.float32)
    for b in range(head, n, BLOCK):
        m = min(BLOCK, n - b)
        src = x[b : b + m]
        for i in range(m):
            buf[i] = _gelu(src[i])
        stream_block(buf, m, out, b)
    if stream:
        store_fence()


@_jit
def gelu_tanh_into(x: Any, out: Any, stream: bool = False) -> None:
    """``out[i] = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``, float32."""
    wide_vectors()
    n = x.shape[0]
    head = stream_head(out, stream)
    for i in range(head):
        out[i] = _gelu_tanh(x[i])
    buf = np.empty(BLOCK if head < n else 0, dtype=np.float32)
    for b in range(head, n, BLOCK):
        m = min(BLOCK, n - b)
        src = x[b : b + m]
        for i in range(m):
            buf[i] = _gelu_tanh(src[i])
        stream_block(buf, m, out, b)
    if stream:
        store_fence()


@_jit
def silu_into(x: Any, out: Any, stream: bool = False) -> None:
    """``out[i] = x * sigmoid(x)`` for 1-D float32 arrays."""
    wide_vectors()
    n = x.shape[0]
    head = stream_head(out, stream)
    for i in range(head):
        out[i] = _silu(x[i])
    buf = np.empty(BLOCK if head < n else 0, dtype=np.float32)
    for b in range(head, n, BLOCK):
        m = min(BLOCK, n - b)
        src = x[b : b + m]
        for i in range(m):
            buf[i] = _silu(src[i])
        stream_block(buf, m, out, b)
    if stream:
        store_fence()


@_jit
def sigmoid_into(x: Any, out: Any, stream: bool = False) -> None:
    """``out[i] = 1 / (1 + exp(-x[i]))`` for 1-D float32 arrays."""
    wide_vectors()
    n = x.shape[0]
    head = stream_head(out, stream)
    for i in range(head):
        out[i] = _sigmoid(x[i])
    buf = np.empty(BLOCK if head < n else 0, dtype=np.float32)
    for b in range(head, n, BLOCK):
        m = min(BLOCK, n - b)
        src = x[b : b + m]
        for i in range(m):
            buf[i] = _sigmoid(src[i])
        stream_block(buf, m, out, b)
    if stream:
        store_fence()


@_jit
def tanh_into(x: Any, out: Any, stream: bool = False) -> None:
    """``out[i] = tanh(x[i])`` for 1-D float32 arrays."""
    wide_vectors()
    n = x.shape[0]
    head = stream_head(out, stream)
    for i in range(head):
        out[i] = _tanh(x[i])
    buf = np.empty(BLOCK if head < n else 0, dtype=np.float32)
    for b in range(head, n, BLOCK):
        m = min(BLOCK, n - b)
        src = x[b : b + m]
        for i in range(m):
            buf[i] = _tanh(src[i])
        stream_block(buf, m, out, b)
    if stream:
        store_fence()


@_jit
def exp_into(x: Any, out: Any, stream: bool = False) -> None:
    """``out[i] = exp(x[i])`` for 1-D float32 arrays."""
    wide_vectors()
    n = x.shape[0]
    head = stream_head(out, stream)
    for i in range(head):
        out[i] = _exp(x[i])
    buf = np.empty(BLOCK if head < n else 0, dtype=np.float32)
    for b in range(head, n, BLOCK):
        m = min(BLOCK, n - b)
        src = x[b : b + m]
        for i in range(m):
            buf[i] = _exp(src[i])
        stream_block(buf, m, out, b)
    if stream:
        store_fence()


@_jit
def log_into(x: Any, out: Any, stream: bool = False) -> None:
    """``out[i] = log(x[i])`` for 1-D float32 arrays."""
    wide_vectors()
    n = x.shape[0]
    head = stream_head(out, stream)
    for i in range(head):
        out[i] = _log(x[i])
    buf = np.empty(BLOCK if head < n else 0, dtype=np.float32)
    for b in range(head, n, BLOCK):
        m = min(BLOCK, n - b)
        src = x[b : b + m]
        for i in range(m):
            buf[i] = _log(src[i])
        stream_block(buf, m, out, b)
    if stream:
        store_fence()


@_jit
def erf_into(x: Any, out: Any, stream: bool = False) -> None:
    """``out[i] = erf(x[i])`` for 1-D float32 arrays (float64 arithmetic)."""
    wide_vectors()
    n = x.shape[0]
    head = stream_head(out, stream)
    for i in range(head):
        out[i] = _erf_of(x[i])
    buf = np.empty(BLOCK if head < n else 0, dtype=np.float32)
    for b in range(head, n, BLOCK):
        m = min(BLOCK, n - b)
        src = x[b : b + m]
        for i in range(m):
            buf[i] = _erf_of(src[i])
        stream_block(buf, m, out, b)
    if stream:
        store_fence()


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
    for fn in (erf_into, log_into, gelu_into, gelu_tanh_into, silu_into, sigmoid_into, tanh_into, exp_into):
        fn(a, a)
        for stream in (False, True):
            fn(a, a, stream)

"""Compiled activation kernels of the CPU backend (numba): GELU, SiLU, erf, sin, cos, leaky ReLU, clip.

Each kernel is one pass over memory with branch-free arithmetic, vectorised with the
CPU's widest vectors (:func:`._nb.wide_vectors`). The float32 transcendentals come from
:mod:`._kmath` (exp, tanh, sigmoid); erf is a rational approximation
``x * N(x**2) / D(x**2)`` on ``[-4, 4]`` (beyond, erf is +-1 in float32) fitted to a
relative error of 8.4e-8, evaluated in float32 (all coefficients positive, so Horner's
rule loses a few units of 2**-24 at most): within 5.2 ULP of erf on every float32
(the worst near ``|x| = 3.4``, where erf is ``1 - 2e-6``; the kit allows 8 eps
relative), checked by ``tests/test_cpu_kernels.py``. Its float64 evaluation (a
float64 division per element) ran at 0.81-0.84 ns per element in cache on one
thread, the float32 one at 0.30: the benchmark's erf row was compute-bound at
0.44-0.52 of the copy bandwidth. GELU uses the same float32 erf (``Phi`` within 4 units
of float32's epsilon, absolutely). GELU_TANH uses
``(1 + tanh(u)) / 2 = 1 / (1 + exp(-2 u))``: one exponential and one division; its
exponential needs no subnormal or overflow care (:func:`_exp_gelu`: one exponent
scale, the shorter polynomial), and sigmoid / SiLU take ``exp(-|x|)`` from
:func:`._kmath._exp_le0` (no overflow clamp, subnormals by ``2**(n + 64) * 2**-64``):
in cache on one thread, against exp's time, sigmoid 1.42 -> 1.03, SiLU 1.37 -> 1.12,
GELU_TANH 1.51 -> 1.22 (the rows were 0.54-0.69 of the copy bandwidth).

sin / cos reduce by pi/2 in three float32 parts (Cody-Waite, each product fused into
its subtraction) and evaluate Cephes' sinf / cosf polynomials: 1.5 ULP below
``|x| = 1000`` and within a tenth of the kit's bound everywhere; arguments from 2**20
on (and inf / NaN) are recomputed one by one by the C library in float64. 0.28 ns per
element in cache against NumPy's float32 ``sin``'s 0.55 (one thread, interleaved); the
per-block calls must take offsets, not slices (slicing 256-element blocks cost as
much again as the arithmetic).

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

from ._kmath import (
    _HALF,
    _LN2_HI,
    _LN2_LO,
    _LOG2E,
    _ONE,
    _ROUND,
    _ROUND127,
    _ROUND_BITS,
    _TWO,
    _exp,
    _exp_short,
    _iand,
    _ishl,
    _isub,
    _ixor,
    _log,
    _sigmoid,
    _tanh,
)
from ._kwrite import BLOCK, store_fence, stream_block, stream_head
from ._nb import as_float, as_int, jit, wide_vectors

__all__ = [
    "erf_into",
    "gelu_into",
    "gelu_tanh_into",
    "silu_into",
    "sigmoid_into",
    "tanh_into",
    "exp_into",
    "log_into",
    "sin_into",
    "cos_into",
    "leaky_relu_into",
    "clip_into",
    "warm_up",
]

# erf(x) ~ x * N(t) / D(t), t = x * x, for |x| <= 4 (D's constant term is 1), fitted in
# float64 and evaluated with the coefficients rounded to float32.
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


_GT_LO = _F(-87.0)  # exp(-87) = 1.6e-38: 1 + e rounds to 1 from here down
_GT_HI = _F(89.0)  # 2**n from n = 128 on is +inf


@_jit
def _exp_gelu(x: float) -> float:
    """exp(x) as GELU_TANH's ``1 + exp(x)`` needs it: one exponent scale (n from -126 to 128).

    Below -87 the result is not exp(x) but still below float32's epsilon (``1 + e`` is 1
    either way); from 88.4 on it is +inf (the quotient ``v / inf``, +-0, then differs
    from the exact one by less than 1e-37); NaN stays NaN. The shorter polynomial.
    """
    xc = _GT_HI if x > _GT_HI else x
    xc = _GT_LO if xc < _GT_LO else xc
    t = xc * _LOG2E + _ROUND127
    nf = t - _ROUND127
    r = xc - nf * _LN2_HI
    r = r - nf * _LN2_LO
    return _exp_short(r) * as_float(_ishl(as_int(t), 23))


@_jit
def _gelu_tanh(v: float) -> float:
    # 0.5 v (1 + tanh(u)) = v / (1 + exp(-2u)); exp is +inf for u << 0 (v / inf = -0).
    u = _TANH_K * (v + _TANH_C * v * v * v)
    return v / (_ONE + _exp_gelu(-_TWO * u))


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
    """``out[i] = erf(x[i])`` for 1-D float32 arrays (float32 arithmetic)."""
    wide_vectors()
    n = x.shape[0]
    head = stream_head(out, stream)
    for i in range(head):
        out[i] = _erf32(x[i])
    buf = np.empty(BLOCK if head < n else 0, dtype=np.float32)
    for b in range(head, n, BLOCK):
        m = min(BLOCK, n - b)
        src = x[b : b + m]
        for i in range(m):
            buf[i] = _erf32(src[i])
        stream_block(buf, m, out, b)
    if stream:
        store_fence()


# sin / cos: x = j pi/2 + r, |r| <= pi/4, with pi/2 in three float32 parts (each product
# fused into its subtraction: r's absolute error about 2**-24 (|r| + |j| 4.4e-8)); then
# Cephes' sinf / cosf polynomials on r, chosen and signed by the quadrant j mod 4
# (cos(x) = sin(x + pi/2): quadrant j + 1). Arguments from _TRIG_BIG on (and inf, NaN)
# are recomputed one by one in float64 by the C library (full argument reduction).
_TWO_OVER_PI = _F(0.6366197723675814)
_PIO2_1 = _F(1.5707963705062866)
_PIO2_2 = _F(-4.371138828673793e-08)
_PIO2_3 = _F(-1.7151245100058819e-15)
_S1 = _F(-1.6666654611e-1)
_S2 = _F(8.3321608736e-3)
_S3 = _F(-1.9515295891e-4)
_C1 = _F(4.166664568298827e-2)
_C2 = _F(-1.388731625493765e-3)
_C3 = _F(2.443315711809948e-5)
_TRIG_BIG = _F(2.0**20)
_TRIG_BIG_BITS = np.int32(0x49800000)  # bits of _TRIG_BIG
_ABS_BITS = np.int32(0x7FFFFFFF)
_I32_ZERO = np.int32(0)
_U = np.uint64


@_jit
def _sin_quadrant(v: float, shift: int) -> float:
    """sin(v + shift pi/2) for float32 ``|v| < _TRIG_BIG`` (NaN gives NaN)."""
    t = v * _TWO_OVER_PI + _ROUND
    j = t - _ROUND
    r = v - j * _PIO2_1
    r = r - j * _PIO2_2
    r = r - j * _PIO2_3
    q = _isub(as_int(t), _ROUND_BITS - shift)
    z = r * r
    s = ((_S3 * z + _S2) * z + _S1) * z * r + r
    c = ((_C3 * z + _C2) * z + _C1) * (z * z) - _HALF * z + _ONE
    res = c if _iand(q, 1) != 0 else s
    return as_float(_ixor(as_int(res), _ishl(_iand(q, 2), 30)))


@_jit
def _trig_block(x: Any, lo: int, m: int, buf: Any, shift: int) -> None:
    """``buf[i] = sin(x[lo + i] + shift pi/2)`` for ``i < m`` (``buf`` at least ``m`` long)."""
    wide_vectors()
    base = _U(lo)
    peak = _I32_ZERO  # the largest bits of |v| (an integer maximum vectorises; NaN counts as far)
    for i in range(m):
        v = x[base + _U(i)]
        buf[i] = _sin_quadrant(v, shift)
        key = _iand(as_int(v), _ABS_BITS)
        peak = key if key > peak else peak
    if peak >= _TRIG_BIG_BITS:
        for i in range(m):
            v = np.float64(x[base + _U(i)])
            if not abs(v) < _TRIG_BIG:
                buf[i] = _F(math.cos(v) if shift else math.sin(v))


@_jit
def _trig_into(x: Any, out: Any, stream: bool, shift: int) -> None:
    """``out = sin(x + shift pi/2)``, block by block through L1 scratch (``out`` may be ``x``)."""
    n = x.shape[0]
    head = stream_head(out, stream) if stream else 0
    buf = np.empty(BLOCK, dtype=np.float32)
    if head:
        _trig_block(x, 0, head, buf, shift)
        for i in range(head):
            out[i] = buf[i]
    for b in range(head, n, BLOCK):
        m = min(BLOCK, n - b)
        _trig_block(x, b, m, buf, shift)
        if stream:
            stream_block(buf, m, out, b)
        else:
            at = _U(b)
            for i in range(m):
                out[at + _U(i)] = buf[i]
    if stream:
        store_fence()


@_jit
def sin_into(x: Any, out: Any, stream: bool = False) -> None:
    """``out[i] = sin(x[i])`` for 1-D float32 arrays (``out`` may be ``x``)."""
    _trig_into(x, out, stream, 0)


@_jit
def cos_into(x: Any, out: Any, stream: bool = False) -> None:
    """``out[i] = cos(x[i])`` for 1-D float32 arrays (``out`` may be ``x``)."""
    _trig_into(x, out, stream, 1)


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
    kernels = (erf_into, sin_into, cos_into, log_into, gelu_into, gelu_tanh_into, silu_into, sigmoid_into)
    for fn in (*kernels, tanh_into, exp_into):
        fn(a, a)
        for stream in (False, True):
            fn(a, a, stream)

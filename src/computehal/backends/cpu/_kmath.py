"""Compiled float32 kernels for the CPU backend's transcendental operations (numba).

NumPy's float32 ``exp`` / ``tanh`` / ``log`` run at about 1.3 ns per element, several
times slower than memory, so sigmoid, tanh, exp, log, softmax and the exponentials of
attention could not reach the machine's bandwidth. These kernels compute the same
functions branch-free (range reduction, a minimax polynomial and selects), so LLVM
vectorises them with the widest SIMD the CPU has, and they fuse the passes of a
softmax so each row is read from memory once.

Accuracy (checked over every 997th float32 bit pattern and all special values by
``tests/test_cpu_kernels.py`` against float64 NumPy, whole float32 range including
subnormal inputs and results): exp 0.98, log 1.13, tanh 1.25 ULP at most (bound 2),
sigmoid 2.18 (bound 2.5: exp, one addition and one division). Special values are
exact (``exp(-inf) = 0``, ``exp(inf) = inf``, overflow to inf, ``log(0) = -inf``,
``log(x < 0) = NaN``, ``tanh(+-inf) = +-1``, NaN in gives NaN out, ``tanh(-0) = -0``).

Every kernel is ``@njit(nogil=True, cache=True)`` and serial: CpuBackend splits the
work over its own thread pool (the calls release the GIL), which stays safe when
several caller threads use the backend at once (numba's default ``workqueue``
threading layer is not). The only fast-math flag is ``contract`` (fused multiply-add,
one rounding fewer), plus ``reassoc`` in the row sum alone, so that LLVM may keep
partial sums in a vector; nothing assumes the absence of NaN or infinity.
Compilation happens on first use and is cached next to this file (or in numba's
user-wide cache directory when that is read-only). Importing this module raises when
numba is missing or cannot compile; CpuBackend then keeps its NumPy paths.
"""

# The function bodies are numba nopython code: numba types them (float32 arithmetic,
# intrinsics), and numba's stubs cannot describe that to mypy.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numpy as np
from numba import types
from numba.extending import intrinsic

from ._nb import as_float as _as_float
from ._nb import as_int as _as_int
from ._nb import jit, wide_vectors
from ._nb import sum32 as _sum32

__all__ = [
    "softmax_rows",
    "softmax_columns",
    "log_softmax_rows",
    "log_softmax_columns",
    "exp_shifted_rowsum",
    "extreme_columns",
    "sum_columns",
    "sum_rows",
    "warm_up",
]


_jit = jit


def _int32_op(name: str, doc: str) -> Any:
    """An intrinsic applying ``builder.<name>`` to two integers as int32 (wrapping, vectorisable).

    Numba widens int32 arithmetic to int64; on AVX2 a 64-bit arithmetic shift has no
    instruction and splits each vector in two, so the bit manipulations stay in int32.
    """

    @intrinsic
    def op(typingctx: Any, a: Any, b: Any) -> Any:
        if not (isinstance(a, types.Integer) and isinstance(b, types.Integer)):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            x = context.cast(builder, args[0], signature.args[0], types.int32)
            y = context.cast(builder, args[1], signature.args[1], types.int32)
            return getattr(builder, name)(x, y)

        return types.int32(a, b), codegen

    op.__doc__ = doc
    return op


_isub = _int32_op("sub", "``a - b`` in int32.")
_isra = _int32_op("ashr", "``a >> b`` (arithmetic) in int32.")
_ishl = _int32_op("shl", "``a << b`` in int32.")
_iand = _int32_op("and_", "``a & b`` in int32.")
_ixor = _int32_op("xor", "``a ^ b`` in int32.")


_F = np.float32
_I = np.int32

# exp: x = n ln2 + r, |r| <= ln2 / 2; ln2 split so that n * _LN2_HI is exact (Cody-Waite).
_LOG2E = _F(1.44269504088896341)
_LN2_HI = _F(0.693359375)
_LN2_LO = _F(-2.12194440e-4)
_ROUND = _F(12582912.0)  # 1.5 * 2**23: adding it rounds to an integer (ties to even)
_ROUND_BITS = _I(0x4B400000)
_EXP_HI = _F(89.0)  # exp(89) overflows float32; larger inputs are clamped here
_EXP_LO = _F(-104.0)  # exp(-104) underflows to 0 (below half the smallest subnormal)
# Minimax coefficients of (exp(r) - 1 - r) / r**2 on [-ln2/2, ln2/2] (Cephes expf).
_E0 = _F(5.0000001201e-1)
_E1 = _F(1.6666665459e-1)
_E2 = _F(4.1665795894e-2)
_E3 = _F(8.3334519073e-3)
_E4 = _F(1.3981999507e-3)
_E5 = _F(1.9875691500e-4)
_ONE = _F(1.0)
_ZERO = _F(0.0)
_TWO = _F(2.0)
_HALF = _F(0.5)


@_jit
def _exp_reduce(xc: float) -> tuple[float, int]:
    """``(r, n)`` with ``xc = n ln2 + r``, ``|r| <= ln2 / 2`` (Cody-Waite).

    The caller clamps ``xc``; a NaN stays in ``r``.
    """
    t = xc * _LOG2E + _ROUND
    nf = t - _ROUND
    n = _as_int(t) - _ROUND_BITS
    r = xc - nf * _LN2_HI
    r = r - nf * _LN2_LO
    return r, n


@_jit
def _exp(x: float) -> float:
    """exp of one float32 (inlined into the vector loops)."""
    # NaN fails both comparisons and travels through unchanged.
    xc = _EXP_HI if x > _EXP_HI else x
    xc = _EXP_LO if xc < _EXP_LO else xc
    r, n = _exp_reduce(xc)
    z = r * r
    p = (((((_E5 * r + _E4) * r + _E3) * r + _E2) * r + _E1) * r + _E0) * z + r + _ONE
    # 2**n as two factors so that results near overflow and in the subnormal range
    # (n from -150 to 128) are scaled without leaving the float32 exponent range.
    n1 = n >> 1
    n2 = n - n1
    s1 = _as_float((n1 + 127) << 23)
    s2 = _as_float((n2 + 127) << 23)
    return p * s1 * s2


_TANH_CLAMP = _F(9.5)  # tanh(x) rounds to +-1 in float32 for |x| > 9.01


# log: x = m 2**e with m in [sqrt(1/2), sqrt(2)); log(x) = e ln2 + log1p(m - 1), and
# log1p(f) = f - f**2 / 2 + f**3 P(f) with P a degree-6 minimax fit (relative error of
# log1p 2**-24.9 on [sqrt(1/2) - 1, sqrt(2) - 1]).
_SQRTH_BITS = _I(0x3F3504F3)  # bits of sqrt(1/2): subtracting them splits off the exponent
_L0 = _F(0.3333391082779945)
_L1 = _F(-0.25001336975065436)
_L2 = _F(0.1996305961903389)
_L3 = _F(-0.1657758841881397)
_L4 = _F(0.14914820794515432)
_L5 = _F(-0.14267457233599948)
_L6 = _F(0.08700225777305082)
_TWO23 = _F(8388608.0)
_SUBNORMAL_SHIFT = _F(23.0)
_MIN_NORMAL = _F(1.17549435e-38)
_INF = _F(np.inf)
_NAN = _F(np.nan)


@_jit
def _log(x: float) -> float:
    """Natural log of one float32 (inlined into the vector loops)."""
    tiny = x < _MIN_NORMAL
    xs = x * _TWO23 if tiny else x  # subnormals: scale into the normal range first
    bits = _as_int(xs)
    # k = exponent of xs, plus one where its mantissa is >= sqrt(2): then m in [sqrt(1/2), sqrt(2)).
    k = _isra(_isub(bits, _SQRTH_BITS), 23)
    f = _as_float(_isub(bits, _ishl(k, 23))) - _ONE
    e = _F(k)
    e = e - _SUBNORMAL_SHIFT if tiny else e
    z = f * f
    p = (((((_L6 * f + _L5) * f + _L4) * f + _L3) * f + _L2) * f + _L1) * f + _L0
    y = p * f * z
    y = y + _LN2_LO * e
    y = y - _HALF * z
    r = f + y
    r = r + _LN2_HI * e
    # x <= 0, NaN and +inf: log(+-0) = -inf, log(x < 0) = NaN, NaN and +inf pass through.
    r = r if x > _ZERO else (-_INF if x == _ZERO else _NAN)
    return r if x < _INF else x


# tanh: odd minimax polynomial below 0.625 (Cephes tanhf), 1 - 2 / (exp(2|x|) + 1) above,
# computed on |x| with x's sign bit put back at the end (so tanh(-0) = -0). A relative
# error d of exp(2|x|) moves that tanh by at most d / 2, so its exp uses a shorter
# polynomial: (exp(r) - 1 - r) / r**2 to degree 4 (relative error 2**-28.3).
_T0 = _F(-5.70498872745e-3)
_T1 = _F(2.06390887954e-2)
_T2 = _F(-5.37397155531e-2)
_T3 = _F(1.33314422036e-1)
_T4 = _F(-3.33332819422e-1)
_TANH_SMALL = _F(0.625)
_ROUND127 = _F(12583039.0)  # 1.5 * 2**23 + 127: t's low bits then hold n + 127
_LN2 = _F(0.6931471805599453)
_Q0 = _F(0.49999993451107844)
_Q1 = _F(0.16666520683705277)
_Q2 = _F(0.04166838748046593)
_Q3 = _F(0.008368710394149388)
_Q4 = _F(0.0013814607625242479)
_SIGN_BIT = _I(-2147483648)


@_jit
def _exp_short(r: float) -> float:
    """exp(r) for a reduced ``r`` by the shorter polynomial ``_Q`` (relative error 2**-28.3)."""
    return ((((_Q4 * r + _Q3) * r + _Q2) * r + _Q1) * r + _Q0) * (r * r) + r + _ONE


@_jit
def _exp_nonpositive(x: float) -> float:
    """exp(x) for x <= 0 or NaN (softmax's ``x - max``): ``_exp`` without the overflow clamp.

    Its polynomial is the shorter one of ``_tanh`` (relative error 2**-28.3): softmax's
    error bound is far looser than one ULP of each exponential.
    """
    xc = _EXP_LO if x < _EXP_LO else x
    r, n = _exp_reduce(xc)
    p = _exp_short(r)
    n1 = n >> 1
    return p * _as_float((n1 + 127) << 23) * _as_float((n - n1 + 127) << 23)


@_jit
def _tanh(x: float) -> float:
    a = abs(x)
    z = a * a
    small = ((((_T0 * z + _T1) * z + _T2) * z + _T3) * z + _T4) * z * a + a
    # exp(2a) for 0 <= a <= 9.5 (or NaN): the result stays normal, one exponent scale suffices.
    # ln 2 in one float32 part (error n * 1.9e-9 relative, n <= 28: well below an ULP of
    # tanh, which moves by a fraction of exp's error), and n + 127 read from t's low bits.
    ac = _TANH_CLAMP if a > _TANH_CLAMP else a  # NaN passes
    xc = ac + ac
    t = xc * _LOG2E + _ROUND127
    r = xc - (t - _ROUND127) * _LN2
    p = _exp_short(r)
    big = _ONE - _TWO / (p * _as_float(_as_int(t) << 23) + _ONE)
    res = small if a < _TANH_SMALL else big
    return _as_float(_as_int(res) ^ (_as_int(x) & _SIGN_BIT))


_ROUND191 = _F(12583103.0)  # 1.5 * 2**23 + 127 + 64: t's low bits then hold n + 191
_TWO_M64 = _F(2.0**-64)


@_jit
def _exp_le0(x: float) -> float:
    """exp(x) for x <= 0 or NaN by the shorter polynomial ``_Q`` (relative error 2**-28.3).

    ``2**n`` (n from -150 to 0) is applied as ``2**(n + 64)``, exact, times ``2**-64``,
    which rounds subnormal results once: three operations where ``_exp`` spends eight on
    its two factors (n + 191 is read from ``t``'s low bits; no overflow clamp).
    """
    xc = _EXP_LO if x < _EXP_LO else x
    t = xc * _LOG2E + _ROUND191
    nf = t - _ROUND191
    r = xc - nf * _LN2_HI
    r = r - nf * _LN2_LO
    return _exp_short(r) * _as_float(_ishl(_as_int(t), 23)) * _TWO_M64


@_jit
def _sigmoid(x: float) -> float:
    # e = exp(-|x|) never overflows; sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) below.
    e = _exp_le0(-abs(x))
    num = e if x < _ZERO else _ONE
    return num / (_ONE + e)


_KEY_MASK = _I(0x7FFFFFFF)


@_jit
def _row_max(row: Any) -> float:
    """The largest value of a row, by an order-preserving integer key (an integer max vectorises).

    Exact for rows without NaN (-0 and +0 may come out either way, which no caller
    can tell apart). A NaN with its sign bit clear is the largest key and is returned;
    one with the sign bit set is the smallest and is passed over.
    """
    best = _I(-2147483648)
    for i in range(row.shape[0]):
        bits = _as_int(row[i])
        key = _ixor(bits, _iand(_isra(bits, 31), _KEY_MASK))
        best = key if key > best else best
    return _as_float(_ixor(best, _iand(_isra(best, 31), _KEY_MASK)))


@_jit
def softmax_rows(x: Any, out: Any) -> None:
    """Softmax along axis 1 of C-contiguous float32 ``[rows, length]`` arrays (``out`` may be ``x``).

    Per row: its maximum, then ``exp(x - max)`` written to ``out``, then the product
    with the reciprocal of their sum (one more rounding than a division, well inside
    softmax's error bound); the row stays in L1/L2 between the passes. NaN semantics match NumPy's
    three-pass form: a NaN or +inf in the row, or a row of only -inf, gives a NaN row.
    """
    for r in range(x.shape[0]):
        src = x[r]
        dst = out[r]
        peak = _row_max(src)
        if peak != peak:
            # A NaN in the row: the reference (x - max, exp, sum) makes every entry NaN.
            for i in range(dst.shape[0]):
                dst[i] = _NAN
            continue
        for i in range(src.shape[0]):
            dst[i] = _exp_nonpositive(src[i] - peak)
        scale = _ONE / _sum32(dst)
        for i in range(dst.shape[0]):
            dst[i] = dst[i] * scale


@_jit
def _column_max(x: Any, c_lo: int, c_hi: int) -> Any:
    """float32 maxima down the rows of columns ``[c_lo, c_hi)`` of ``x`` (NaN ignored, -inf when none)."""
    w = c_hi - c_lo
    peak = np.full(w, -_INF, dtype=np.float32)
    for r in range(x.shape[0]):
        src = x[r, c_lo:c_hi]
        for j in range(w):
            peak[j] = np.fmax(peak[j], src[j])
    return peak


@_jit
def softmax_columns(x: Any, out: Any, c_lo: int, c_hi: int) -> None:
    """Softmax along axis 0 of columns ``[c_lo, c_hi)`` of C-contiguous float32 ``[length, width]`` arrays.

    ``out`` may be ``x``. Three passes down the rows, each inner loop running along a
    contiguous row segment: the column maxima; ``exp(x - max)`` written to ``out`` and
    added (in float64) to the column sums while the row is in L1; the product with the
    sums' reciprocals.
    NaN semantics match NumPy's three-pass form: NaN is ignored in the maximum and
    then makes its column NaN through the sum; a +inf or an all -inf column gives NaN.
    """
    length = x.shape[0]
    w = c_hi - c_lo
    peak = _column_max(x, c_lo, c_hi)
    total = np.zeros(w, dtype=np.float64)
    for r in range(length):
        src = x[r, c_lo:c_hi]
        dst = out[r, c_lo:c_hi]
        for j in range(w):
            dst[j] = _exp_nonpositive(src[j] - peak[j])
        for j in range(w):
            total[j] += dst[j]
    scale = (1.0 / total).astype(np.float32)
    for r in range(length):
        dst = out[r, c_lo:c_hi]
        for j in range(w):
            dst[j] = dst[j] * scale[j]


@_jit
def log_softmax_rows(x: Any, out: Any) -> None:
    """Log-softmax along axis 1 of C-contiguous float32 ``[rows, length]`` arrays (``out`` may be ``x``).

    Per row: the maximum, the sum of ``exp(x - max)`` (written to ``out`` as scratch),
    then ``x - max - log(sum)``. -inf entries stay -inf; a NaN or +inf in the row, or a
    row of only -inf, gives a NaN row (as the three-pass NumPy form).
    """
    for r in range(x.shape[0]):
        src = x[r]
        dst = out[r]
        peak = _row_max(src)
        for i in range(src.shape[0]):
            dst[i] = _exp_nonpositive(src[i] - peak)
        shift = _log(_sum32(dst))
        for i in range(dst.shape[0]):
            dst[i] = (src[i] - peak) - shift


@_jit
def log_softmax_columns(x: Any, out: Any, c_lo: int, c_hi: int) -> None:
    """Log-softmax along axis 0 of columns ``[c_lo, c_hi)`` of C-contiguous float32 ``[length, width]``.

    ``out`` may be ``x``. Three passes down the rows (inner loops along contiguous row
    segments): column maxima, the float64 sums of ``exp(x - max)``, then
    ``x - max - log(sum)``.
    """
    length = x.shape[0]
    w = c_hi - c_lo
    peak = _column_max(x, c_lo, c_hi)
    total = np.zeros(w, dtype=np.float64)
    for r in range(length):
        src = x[r, c_lo:c_hi]
        for j in range(w):
            total[j] += _exp_nonpositive(src[j] - peak[j])
    shift = np.log(total).astype(np.float32)
    for r in range(length):
        src = x[r, c_lo:c_hi]
        dst = out[r, c_lo:c_hi]
        for j in range(w):
            dst[j] = (src[j] - peak[j]) - shift[j]


@_jit
def extreme_columns(x: Any, out: Any, c_lo: int, c_hi: int, largest: bool) -> None:
    """``out[j - c_lo]`` = fmax (``largest``) or fmin over the rows of column ``j`` in ``[c_lo, c_hi)``.

    ``x`` is a C-contiguous float32 ``[length, width]`` array; NaN is ignored, so an
    empty or all-NaN column gives -inf (fmax) or +inf (fmin), like NumPy's
    ``fmax.reduce(initial=-inf)``. The running value is never NaN, so a comparison
    and a select (one vector max / min) does what ``fmax`` does.
    """
    wide_vectors()
    length = x.shape[0]
    w = c_hi - c_lo
    acc = out[:w]
    acc[:] = -_INF if largest else _INF
    for r in range(length):
        src = x[r, c_lo:c_hi]
        if largest:
            for j in range(w):
                v = src[j]
                acc[j] = v if v > acc[j] else acc[j]
        else:
            for j in range(w):
                v = src[j]
                acc[j] = v if v < acc[j] else acc[j]


@_jit
def sum_columns(x: Any, out: Any) -> None:
    """``out[j] = sum(x[:, j])`` for a C-contiguous float32 ``[length, width]`` array.

    Rows are streamed whole into float32 running sums (a plain sum's error, ``length``
    units of float32's epsilon at worst, as the contract allows).
    """
    wide_vectors()
    w = x.shape[1]
    acc = out[:w]
    acc[:] = _ZERO
    for r in range(x.shape[0]):
        src = x[r]
        for j in range(w):
            acc[j] += src[j]


#: Elements summed in float32 before a row's partial sum goes into its float64 total.
_SUM_CHUNK = 8192


@_jit
def sum_rows(x: Any, out: Any) -> None:
    """``out[r] = sum(x[r])`` for a C-contiguous float32 ``[rows, length]`` array.

    Vector partial sums in float32 over chunks of :data:`_SUM_CHUNK` elements, the
    chunks added in float64.
    """
    wide_vectors()
    length = x.shape[1]
    for r in range(x.shape[0]):
        row = x[r]
        total = 0.0
        for c in range(0, length, _SUM_CHUNK):
            total += np.float64(_sum32(row[c : min(length, c + _SUM_CHUNK)]))
        out[r] = _F(total)


@_jit
def exp_shifted_rowsum(scores: Any, shift: Any, sums: Any) -> None:
    """In place ``scores[i, j] = exp(scores[i, j] - shift[i])``; ``sums[i]`` gets each row's sum.

    The attention inner step: one pass over the score tile instead of three.
    """
    for r in range(scores.shape[0]):
        row = scores[r]
        s = shift[r]
        for j in range(row.shape[0]):
            row[j] = _exp(row[j] - s)
        sums[r] = _sum32(row)


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel of this module now."""
    x = np.zeros(4, dtype=_F)
    rows = np.zeros((2, 4), dtype=_F)
    softmax_rows(rows, rows)
    softmax_columns(rows, rows, 0, 4)
    log_softmax_rows(rows, rows)
    log_softmax_columns(rows, rows, 0, 4)
    extreme_columns(rows, x, 0, 4, True)
    extreme_columns(rows, x, 0, 4, False)
    sum_columns(rows, x)
    sum_rows(rows, x[:2])
    exp_shifted_rowsum(rows, x[:2], x[2:])

"""Compiled float32 LRN kernel of the CPU backend (numba) for ONNX's default ``beta = 0.75``.

``y = x * t ** -0.75`` with ``t = bias + alpha / size * sum(x[c'] ** 2)`` over the channel
window ``c - (size - 1) // 2 .. c + size // 2`` clipped to the image. The data are
[N, C, S] (channel planes of ``S`` pixels), so a pixel's window is ``size`` rows apart.

Why it is written as it is (measured on one core of this 2-core Xeon, against a copy of
the same 6.4 MB, 8 x 64 x 56 x 56):

* The arithmetic is not what costs. A loop over whole channel rows that keeps a running
  window sum in an array (``acc += enter**2 - leave**2``, one channel at a time) reads
  four arrays and writes two per element; with rows of a few KiB those live in L2, not
  L1, and the loop ran at 0.6-0.65 ns an element whether or not ``t ** -0.75`` was taken
  (a copy: 0.33-0.4). Splitting the rows into L1-sized pieces was slower still (each
  new piece of a row is a new memory stream that starts with a full miss).
* So :func:`_lrn_lanes` takes 16 pixels (one AVX-512 vector, written as an LLVM vector so
  that no alias check or loop remainder gets in the way) through a group of
  :data:`GROUP` channels at once: the window sum of the group's first channel from
  scratch, then the running sum, all in registers. Every row of the group is read from
  L1 a few times, from memory once, and nothing but the output is written.
* ``t ** -0.75`` is ``q * q * w`` with ``q = t ** -0.5`` and ``w = q ** -0.5`` from
  AVX-512's reciprocal square root estimate and one Newton step each (elsewhere a bit
  estimate of ``t ** -0.25`` and three Newton steps): no division or square root; the
  outputs came within 3 eps of float64 NumPy (the tests allow 16). With ``t`` in place of
  the power the kernel ran at 0.85 of the copy, with the three Newton steps at
  0.65-0.68, with the estimate at 0.71-0.74 (the running-array kernel: 0.42-0.57).
* Where some ``t`` of the group leaves [1e-30, 1e30] (NaN, infinity, overflow), or the
  running sum's rounding could show (``|alpha| / size`` times the largest sum above a
  quarter of the smallest ``t``), the group's 16 pixels are recomputed with sums from
  scratch and ``pow`` (:func:`_lrn_exact`).

In the benchmark harness (two threads, whole planes as pieces, under load from other
processes) the row went from 0.30-0.61 to 0.80-1.7 of the copy ceiling, old and new code
run alternately.
"""

# Function bodies are numba nopython code or LLVM IR builders, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

import math
from typing import Any

import numpy as np
from llvmlite import ir
from llvmlite.binding import get_host_cpu_features
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

from ._kpull import run_pulled, take
from ._llvm import splat
from ._nb import jit, wide_vectors

__all__ = ["GROUP", "LANES", "lrn_all", "lrn_pieces", "lrn_pulled", "warm_up"]

#: Pixels per vector.
LANES = 16
#: Channels taken through the registers at once (the window sum restarts at each group).
GROUP = 8
#: ``t ** -0.25`` to 10 % from the bits of ``t``: exponent and mantissa divided by -4.
_QUARTER_MAGIC = 0x4F580000
#: ``t`` outside these bounds goes to the exact path.
_T_LO = 1e-30
_T_HI = 1e30
_F_POWER = np.float32(0.75)
#: Whether LLVM may use AVX-512's reciprocal square root estimate: numba compiles for this
#: host unless told to compile for a named CPU (then the portable Newton steps).
_AVX512 = (
    config.CPU_NAME is None
    and config.CPU_FEATURES is None
    and bool(get_host_cpu_features().get("avx512f", False))
)


def _const(vec: Any, value: float) -> Any:
    return ir.Constant(vec, [value] * LANES)


def _rsqrt14(builder: Any, t: Any) -> Any:
    """AVX-512's ``vrsqrt14ps``: ``1 / sqrt(t)`` to 2**-14."""
    vec = t.type
    fnty = ir.FunctionType(vec, [vec, vec, ir.IntType(16)])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.rsqrt14.ps.512")
    return builder.call(fn, [t, _const(vec, 0.0), ir.IntType(16)(0xFFFF)])


def _newton_rsqrt(builder: Any, r: Any, t: Any) -> Any:
    """One Newton step for ``1 / sqrt(t)``: ``r (3 - t r**2) / 2``."""
    vec = t.type
    half_t = builder.fmul(_const(vec, 0.5), t)
    return builder.fmul(r, builder.fsub(_const(vec, 1.5), builder.fmul(half_t, builder.fmul(r, r))))


def _inv_pow34(builder: Any, t: Any, vec: Any) -> Any:
    """``t ** -0.75`` for a vector of float32 ``t`` in [1e-30, 1e30], to about 5 eps.

    With AVX-512: ``q = t ** -0.5`` and ``w = q ** -0.5 = t ** 0.25`` from ``vrsqrt14ps``
    and one Newton step each, then ``q * q * w``. Elsewhere: a bit estimate of
    ``t ** -0.25`` (exponent and mantissa divided by -4) and three Newton steps on
    ``z**-4 = t`` (``z <- z (5 - t z**4) / 4``), then ``z**3``.
    """
    if _AVX512:
        q = _newton_rsqrt(builder, _rsqrt14(builder, t), t)
        w = _newton_rsqrt(builder, _rsqrt14(builder, q), q)
        return builder.fmul(builder.fmul(q, q), w)
    ivec = ir.VectorType(ir.IntType(32), LANES)
    shifted = builder.ashr(builder.bitcast(t, ivec), ir.Constant(ivec, [2] * LANES))
    z = builder.bitcast(builder.sub(ir.Constant(ivec, [_QUARTER_MAGIC] * LANES), shifted), vec)
    quarter_t = builder.fmul(_const(vec, 0.25), t)
    for _ in range(3):
        z2 = builder.fmul(z, z)
        z = builder.fmul(z, builder.fsub(_const(vec, 1.25), builder.fmul(quarter_t, builder.fmul(z2, z2))))
    return builder.fmul(builder.fmul(z, z), z)


def _vmax(builder: Any, a: Any, b: Any) -> Any:
    return builder.select(builder.fcmp_ordered(">", a, b), a, b)


def _vmin(builder: Any, a: Any, b: Any) -> Any:
    return builder.select(builder.fcmp_ordered("<", a, b), a, b)


class _Lanes:
    """IR of :func:`_lrn_lanes`: the operands, and the running state kept in allocas."""

    def __init__(self, context: Any, builder: Any, signature: Any, args: Any) -> None:
        self.b = builder
        self.vec = ir.VectorType(ir.FloatType(), LANES)
        self.xdata = context.make_array(signature.args[0])(context, builder, args[0]).data
        self.odata = context.make_array(signature.args[1])(context, builder, args[1]).data
        self.at, self.stride, self.c0, self.count, self.channels, self.below, self.above = (
            context.cast(builder, args[i], signature.args[i], types.int64) for i in range(2, 9)
        )
        self.coeff, self.offset = splat(builder, args[9], self.vec), splat(builder, args[10], self.vec)
        fabs = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.FloatType(), [ir.FloatType()]), "llvm.fabs.f32"
        )
        self.scale = splat(builder, builder.call(fabs, [args[9]]), self.vec)
        # The running sum, its largest value, the smallest and largest t.
        self.total, self.top, self.t_min, self.t_max = (
            cgutils.alloca_once(builder, self.vec) for _ in range(4)
        )

    def row(self, r: Any, data: Any = None) -> Any:
        where = self.b.gep(
            self.xdata if data is None else data, [self.b.add(self.at, self.b.mul(r, self.stride))]
        )
        return self.b.bitcast(where, self.vec.as_pointer())

    def load(self, r: Any) -> Any:
        return self.b.load(self.row(r), align=4)

    def square_if(self, present: Any, r: Any, c: Any) -> Any:
        """``x[r] ** 2`` where ``present``, else 0 (row ``c`` is read instead: always inside)."""
        v = self.load(self.b.select(present, r, c))
        return self.b.select(present, self.b.fmul(v, v), _const(self.vec, 0.0))

    def first_window(self) -> None:
        b, i64 = self.b, ir.IntType(64)
        b.store(_const(self.vec, 0.0), self.total)
        start = b.sub(self.c0, self.below)
        lo = b.select(b.icmp_signed(">", start, i64(0)), start, i64(0))
        end = b.add(b.add(self.c0, self.above), i64(1))
        hi = b.select(b.icmp_signed("<", end, self.channels), end, self.channels)
        with cgutils.for_range_slice(b, lo, hi, i64(1), inc=True) as (r, _):
            v = self.load(r)
            b.store(b.fadd(b.load(self.total), b.fmul(v, v)), self.total)

    def step(self, k: int) -> None:
        """Channel ``c0 + k``: the running sum (after the first), the extremes, the output."""
        b, i64 = self.b, ir.IntType(64)
        c = b.add(self.c0, i64(k))
        s = b.load(self.total)
        if k:
            enter = b.add(c, self.above)
            leave = b.sub(b.sub(c, self.below), i64(1))
            s = b.fadd(s, self.square_if(b.icmp_signed("<", enter, self.channels), enter, c))
            s = b.fsub(s, self.square_if(b.icmp_signed(">=", leave, i64(0)), leave, c))
            b.store(s, self.total)
        t = b.fadd(self.offset, b.fmul(self.coeff, s))
        if k:
            b.store(_vmax(b, s, b.load(self.top)), self.top)
            b.store(_vmin(b, t, b.load(self.t_min)), self.t_min)
            b.store(_vmax(b, t, b.load(self.t_max)), self.t_max)
        else:
            b.store(s, self.top)
            b.store(t, self.t_min)
            b.store(t, self.t_max)
        b.store(b.fmul(self.load(c), _inv_pow34(b, t, self.vec)), self.row(c, self.odata), align=4)

    def verdict(self) -> Any:
        """Nonzero unless every ``t`` was in [1e-30, 1e30] and the rounding bound held.

        NaN never enters the extremes, but a NaN or infinite sum stays so to the group's
        end (each step adds to it), so the last sum is checked as well.
        """
        b, vec = self.b, self.vec
        t_min, t_max, s = b.load(self.t_min), b.load(self.t_max), b.load(self.total)
        ok = b.and_(
            b.fcmp_ordered(">=", t_min, _const(vec, _T_LO)), b.fcmp_ordered("<=", t_max, _const(vec, _T_HI))
        )
        ok = b.and_(
            ok, b.fcmp_ordered("<=", b.fmul(self.scale, b.load(self.top)), b.fmul(_const(vec, 0.25), t_min))
        )
        ok = b.and_(ok, b.fcmp_ordered("<", s, _const(vec, math.inf)))
        return b.zext(b.bitcast(b.not_(ok), ir.IntType(16)), ir.IntType(32))


def _lanes_codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    lanes = _Lanes(context, builder, signature, args)
    lanes.first_window()
    lanes.step(0)
    for k in range(1, GROUP):
        with builder.if_then(builder.icmp_signed("<", ir.IntType(64)(k), lanes.count)):
            lanes.step(k)
    return lanes.verdict()


@intrinsic
def _lrn_lanes(
    typingctx: Any,
    xf: Any,
    of: Any,
    at: Any,
    stride: Any,
    c0: Any,
    count: Any,
    channels: Any,
    below: Any,
    above: Any,
    coeff: Any,
    offset: Any,
) -> Any:
    """LRN of 16 pixels through channels ``[c0, c0 + count)`` (``count <= GROUP``); nonzero: redo them.

    ``xf`` / ``of`` are flat float32 arrays; channel ``r`` of the 16 pixels starts at
    ``at + r * stride``. ``coeff = alpha / size`` and ``offset = bias`` are float32.
    """
    f32 = types.float32
    if not all(isinstance(a, types.Array) and a.dtype == f32 and a.ndim == 1 for a in (xf, of)):
        return None
    ints = (at, stride, c0, count, channels, below, above)
    if not all(isinstance(a, types.Integer) for a in ints) or coeff != f32 or offset != f32:
        return None
    return types.int32(xf, of, *ints, coeff, offset), _lanes_codegen


@jit
def _lrn_exact(
    x: Any, out: Any, j0: int, j1: int, c0: int, c1: int, below: int, above: int, coeff: Any, offset: Any
):
    """Channels ``[c0, c1)``, pixels ``[j0, j1)`` of one image [C, S]: window sums from scratch, ``pow``
    (IEEE's special cases: ``(-inf) ** 0.75`` is ``inf``, a negative finite ``t`` gives NaN)."""
    channels = x.shape[0]
    for c in range(c0, c1):
        lo, hi = max(0, c - below), min(channels - 1, c + above)
        for j in range(j0, j1):
            s = np.float32(0.0)
            for k in range(lo, hi + 1):
                s += x[k, j] * x[k, j]
            out[c, j] = x[c, j] / (offset + coeff * s) ** _F_POWER


@jit
def lrn_pieces(x: Any, out: Any, k0: int, k1: int, width: int, size: int, alpha: float, bias: float) -> None:
    """LRN of pieces ``[k0, k1)`` of C-contiguous float32 [N, C, S] ``x`` into ``out``: piece ``k``
    is image ``k // pieces`` (``pieces`` per image), pixels from ``(k % pieces) * width``, ``width`` wide."""
    wide_vectors()
    n, channels, spatial = x.shape
    xf, of = x.reshape(-1), out.reshape(-1)
    below, above = (size - 1) // 2, size // 2
    coeff, offset = np.float32(alpha / size), np.float32(bias)
    pieces = (spatial + width - 1) // width
    for k in range(k0, k1):
        i = k // pieces
        j0 = (k % pieces) * width
        j1 = min(spatial, j0 + width)
        # Whole vectors; the last one ends at the piece's end (a few pixels computed twice,
        # to the same values); a piece narrower than a vector takes the exact path.
        body = j1 if j1 - j0 >= LANES else j0
        base = i * channels * spatial
        for c0 in range(0, channels, GROUP):
            count = min(GROUP, channels - c0)
            for first in range(j0, body, LANES):
                j = min(first, j1 - LANES)
                if _lrn_lanes(xf, of, base + j, spatial, c0, count, channels, below, above, coeff, offset):
                    _lrn_exact(x[i], out[i], j, j + LANES, c0, c0 + count, below, above, coeff, offset)
        if body < j1:
            _lrn_exact(x[i], out[i], body, j1, 0, channels, below, above, coeff, offset)


@jit
def lrn_pulled(taken, done, blocks, count, x, out, width, size, alpha, bias):
    """:func:`lrn_pieces` over ``count`` pieces in ``blocks`` blocks (:func:`._kpull.run_pulled`)."""
    per = (count + blocks - 1) // blocks
    t = take(taken)
    while t < blocks:
        k0 = t * per
        k1 = min(count, k0 + per)
        if k0 < k1:
            lrn_pieces(x, out, k0, k1, width, size, alpha, bias)
        take(done)
        t = take(taken)


def lrn_all(
    x: Any, out: Any, count: int, width: int, size: int, alpha: float, bias: float, blocks: int
) -> None:
    """:func:`lrn_pieces` over all ``count`` pieces, pulled in ``blocks`` blocks by every thread."""
    run_pulled(lrn_pulled, (count, x, out, width, size, alpha, bias), blocks, blocks)


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels."""
    x = np.ones((1, 3, 20), dtype=np.float32)
    lrn_pieces(x, x.copy(), 0, 1, 20, 3, 1e-4, 1.0)
    lrn_all(x, x.copy(), 1, 20, 3, 1e-4, 1.0, 1)

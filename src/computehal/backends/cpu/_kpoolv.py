"""The column fold of stride-2 pooling as explicit LLVM vectors (numba intrinsic).

``out[j] = fold(row[2 j], row[2 j + 1], row[2 j + 2])`` (one to three taps, dilation 1)
for 16 outputs at a time: two vector loads give the even and odd columns through one
shuffle each (and two more loads at ``+2`` the next even ones), then two vector max or
add operations. LLVM's own vectorisation of the strided loop used gathers, which cost
most of a 3x3 stride-2 max pool's time (8 x 64 x 112 x 112 on one core of this Xeon:
0.39-0.42 ns an input element before, against 0.33 for a copy of the same size).

Global average pooling's row sums: :func:`sum_f32` (one row in 16 partial sums and one
masked load) and :func:`means16_f32` (16 rows at once, their sums in 16 independent
registers and halved across rows by shuffles; the same additions in the same order, 10%
less time on 8 x 2048 rows of 7 x 7 than one row at a time, interleaved measurement).
"""

# Function bodies are LLVM IR builders, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._llvm import LANES, first_lanes, masked_load, splat

__all__ = ["LANES", "fold_rows", "fold_stride2", "means16_f32", "sum_f32"]


def _vectors(context: Any, builder: Any, signature: Any, args: Any) -> tuple[Any, ...]:
    vec = ir.VectorType(context.get_value_type(signature.args[0].dtype), LANES)
    row = context.make_array(signature.args[0])(context, builder, args[0]).data
    at = context.cast(builder, args[1], signature.args[1], types.int64)

    def load(offset: int) -> Any:
        where = builder.gep(row, [builder.add(at, ir.IntType(64)(offset))])
        return builder.load(builder.bitcast(where, vec.as_pointer()), align=4)

    even_lanes = ir.Constant(ir.VectorType(ir.IntType(32), LANES), list(range(0, 2 * LANES, 2)))
    odd_lanes = ir.Constant(ir.VectorType(ir.IntType(32), LANES), list(range(1, 2 * LANES, 2)))
    a, b = load(0), load(LANES)
    c, d = load(2), load(LANES + 2)
    even = builder.shuffle_vector(a, b, even_lanes)
    odd = builder.shuffle_vector(a, b, odd_lanes)
    after = builder.shuffle_vector(c, d, even_lanes)
    return vec, even, odd, after


def _fold_codegen(taps: int, is_max: bool) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        vec, even, odd, after = _vectors(context, builder, signature, args)
        value = even
        for v in (odd, after)[: taps - 1]:
            if is_max:  # v if v > value else value: the row holds no NaN for a max
                value = builder.select(builder.fcmp_ordered(">", v, value), v, value)
            else:
                value = builder.fadd(value, v)
        out = context.make_array(signature.args[2])(context, builder, args[2]).data
        d = context.cast(builder, args[3], signature.args[3], types.int64)
        if not is_max:
            counts = context.make_array(signature.args[4])(context, builder, args[4]).data
            j = context.cast(builder, args[5], signature.args[5], types.int64)
            cc = builder.load(builder.bitcast(builder.gep(counts, [j]), vec.as_pointer()), align=4)
            value = builder.fdiv(value, builder.fmul(cc, splat(builder, args[6], vec)))
        builder.store(value, builder.bitcast(builder.gep(out, [d]), vec.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def fold_stride2(
    typingctx: Any,
    row: Any,
    at: Any,
    out: Any,
    d: Any,
    counts: Any,
    j: Any,
    scale: Any,
    taps: Any,
    is_max: Any,
) -> Any:
    """``out[d + i]`` = fmax / mean of ``row[at + 2 i + s]`` over the ``taps`` (literal 1-3) taps ``s``.

    For ``i < 16``; a mean divides by ``counts[j + i] * scale``. ``row``, ``out`` and
    ``counts`` are 1-D arrays of one float type (``scale`` of it too); ``row`` holds
    ``at + 2 * 16 + 2`` elements at least, and never a NaN for a max. ``is_max`` is a
    literal boolean.
    """
    if not isinstance(row, types.Array) or row.dtype not in (types.float32, types.float64):
        return None
    arrays = (row, out, counts)
    if not all(isinstance(a, types.Array) and a.dtype == row.dtype and a.ndim == 1 for a in arrays):
        return None
    if not isinstance(taps, types.IntegerLiteral) or not isinstance(is_max, types.BooleanLiteral):
        return None
    if not all(isinstance(a, types.Integer) for a in (at, d, j)) or scale != row.dtype:
        return None
    sig = types.void(row, at, out, d, counts, j, scale, taps, is_max)
    return sig, _fold_codegen(taps.literal_value, is_max.literal_value)


def _rows_codegen(rows: int, is_max: bool) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        vec = ir.VectorType(context.get_value_type(signature.args[0].dtype), LANES)
        xf = context.make_array(signature.args[0])(context, builder, args[0]).data
        src, step = (context.cast(builder, args[i], signature.args[i], types.int64) for i in (1, 2))
        value = None
        for r in range(rows):
            at = builder.add(src, builder.mul(step, ir.IntType(64)(r)))
            v = builder.load(builder.bitcast(builder.gep(xf, [at]), vec.as_pointer()), align=4)
            if is_max:  # v if v > value else value, from -inf: a NaN never becomes the value
                if value is None:
                    value = splat(builder, args[5], vec)
                value = builder.select(builder.fcmp_ordered(">", v, value), v, value)
            else:
                value = v if value is None else builder.fadd(value, v)
        row = context.make_array(signature.args[3])(context, builder, args[3]).data
        at = context.cast(builder, args[4], signature.args[4], types.int64)
        builder.store(value, builder.bitcast(builder.gep(row, [at]), vec.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def fold_rows(
    typingctx: Any, xf: Any, src: Any, step: Any, row: Any, at: Any, low: Any, rows: Any, is_max: Any
) -> Any:
    """``row[at + q]`` = fmax (from ``low``, NaN skipped) / sum of ``xf[src + r * step + q]``, ``r < rows``.

    For ``q < 16``; ``rows`` (1-3) and ``is_max`` are literals; ``xf`` and ``row`` are
    1-D arrays of one float type, ``low`` (-inf) of it too.
    """
    if not isinstance(xf, types.Array) or xf.dtype not in (types.float32, types.float64):
        return None
    if not isinstance(row, types.Array) or row.dtype != xf.dtype or xf.ndim != 1 or row.ndim != 1:
        return None
    if not isinstance(rows, types.IntegerLiteral) or not isinstance(is_max, types.BooleanLiteral):
        return None
    if not all(isinstance(a, types.Integer) for a in (src, step, at)) or low != xf.dtype:
        return None
    sig = types.void(xf, src, step, row, at, low, rows, is_max)
    return sig, _rows_codegen(rows.literal_value, is_max.literal_value)


def _sum_codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    i32 = ir.IntType(32)
    xf = context.make_array(signature.args[0])(context, builder, args[0]).data
    start, count = (context.cast(builder, args[i], signature.args[i], types.int64) for i in (1, 2))
    value = _row_partials(builder, [builder.gep(xf, [start])], count)[0]
    width = LANES
    while width > 1:  # pairwise halving: lane i += lane i + width / 2
        width //= 2
        upper = ir.Constant(ir.VectorType(i32, LANES), [i + width if i < width else i for i in range(LANES)])
        value = builder.fadd(value, builder.shuffle_vector(value, value, upper))
    return builder.extract_element(value, i32(0))


@intrinsic
def sum_f32(typingctx: Any, xf: Any, start: Any, count: Any) -> Any:
    """Sum of ``xf[start:start + count]`` (float32, 1-D): 16 partial sums, then pairwise halving.

    Each partial sum adds every 16th value in order, so the result's rounding error is at
    most ``(count / 16 + 4)`` units of float32 roundoff times the sum of magnitudes.
    """
    if not isinstance(xf, types.Array) or xf.dtype != types.float32 or xf.ndim != 1:
        return None
    if not all(isinstance(a, types.Integer) for a in (start, count)):
        return None
    return types.float32(xf, start, count), _sum_codegen


def _row_partials(builder: Any, firsts: list[Any], cols: Any) -> list[Any]:
    """16 partial sums (a vector) of the ``cols`` float32 values at each pointer of ``firsts``.

    Lane ``i`` of a row's vector adds the row's values ``i``, ``i + 16``, ... in order,
    the last 0-15 of them through one masked load (no lane past the row is read); the
    rows' sums are independent, so several rows have no dependency chain between them.
    """
    i32, i64 = ir.IntType(32), ir.IntType(64)
    vec = ir.VectorType(ir.FloatType(), LANES)
    zero = ir.Constant(vec, [0.0] * LANES)
    accs = [cgutils.alloca_once_value(builder, zero) for _ in firsts]
    whole = builder.udiv(cols, i64(LANES))
    with cgutils.for_range(builder, whole) as loop:
        step = builder.mul(loop.index, i64(LANES))
        for first, acc in zip(firsts, accs, strict=True):
            v = builder.load(builder.bitcast(builder.gep(first, [step]), vec.as_pointer()), align=4)
            builder.store(builder.fadd(builder.load(acc), v), acc)
    done = builder.mul(whole, i64(LANES))
    mask, load = first_lanes(builder, builder.sub(cols, done)), masked_load(builder)
    sums = []
    for first, acc in zip(firsts, accs, strict=True):  # the rest of each row (0-15 values)
        where = builder.bitcast(builder.gep(first, [done]), vec.as_pointer())
        sums.append(builder.fadd(builder.load(acc), builder.call(load, [where, i32(4), mask, zero])))
    return sums


def _transpose_add(builder: Any, rows: list[Any]) -> Any:
    """One vector whose lane ``r`` is the sum of the lanes of ``rows[r]`` (16 vectors).

    Four rounds; in each, two vectors holding ``16 / block`` rows' partial sums each are
    combined by two shuffles (every block's first and second halves) and one add: lane
    ``j`` of a row is added to lane ``j + block / 2``, as :func:`sum_f32` halves its vector.
    """
    i32 = ir.IntType(32)
    block = LANES
    while block > 1:
        half = block // 2
        low = [b * block + i for b in range(LANES // block) for i in range(half)]
        high = [j + half for j in low]
        pick_low = ir.Constant(ir.VectorType(i32, LANES), low + [LANES + j for j in low])
        pick_high = ir.Constant(ir.VectorType(i32, LANES), high + [LANES + j for j in high])
        rows = [
            builder.fadd(
                builder.shuffle_vector(rows[i], rows[i + 1], pick_low),
                builder.shuffle_vector(rows[i], rows[i + 1], pick_high),
            )
            for i in range(0, len(rows), 2)
        ]
        block = half
    return rows[0]


def _means16_codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, LANES)
    xf = context.make_array(signature.args[0])(context, builder, args[0]).data
    out = context.make_array(signature.args[3])(context, builder, args[3]).data
    start, cols, at = (context.cast(builder, args[i], signature.args[i], types.int64) for i in (1, 2, 4))
    firsts = [builder.gep(xf, [builder.add(start, builder.mul(i64(r), cols))]) for r in range(LANES)]
    sums = _transpose_add(builder, _row_partials(builder, firsts, cols))
    divisor = splat(builder, builder.sitofp(cols, f32), vec)
    where = builder.bitcast(builder.gep(out, [at]), vec.as_pointer())
    builder.store(builder.fdiv(sums, divisor), where, align=4)
    return context.get_dummy_value()


@intrinsic
def means16_f32(typingctx: Any, xf: Any, start: Any, cols: Any, out: Any, at: Any) -> Any:
    """``out[at + r]`` = mean of ``xf[start + r cols : start + (r + 1) cols]`` for r < 16 (float32).

    Each row's 16 partial sums as in :func:`sum_f32`; the 16 vectors are then halved
    pairwise across rows (two shuffles and one add per pair, four rounds) into one vector
    of 16 sums, divided by ``cols`` and stored at once: the sums are bit-for-bit those of
    :func:`sum_f32` (the same additions in the same order), without a horizontal
    reduction and a scalar store per row.
    """
    arrays = (xf, out)
    if not all(isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1 for a in arrays):
        return None
    if not all(isinstance(a, types.Integer) for a in (start, cols, at)):
        return None
    return types.void(xf, start, cols, out, at), _means16_codegen

"""A compiled float32 product for the convolutions' GEMMs: ``y = f @ x + bias``, read in place.

``f`` [K, R] (filter rows), ``x`` [R, W] (an image's pixels or im2col columns), ``y``
[K, W], each with its own row stride. The microkernel (:func:`_tile`, written in LLVM IR
since numba has no vector type) keeps a block of :data:`ROWS` output channels by
:data:`VECTORS` vectors of 16 pixels in registers, starts them at the bias, and for
each of the R inner steps broadcasts one filter value per channel and loads the pixels'
vectors once: 16 fused multiply-adds for 10 loads. The pixels are blocked so that a
block's panel of ``x`` stays in L2 while every channel block reads it; the last vector
of a row is a masked load and store, so nothing outside the operands is touched.

Against OpenBLAS (NumPy's build, one thread) on the same memory it reads ``x`` without
packing it and writes each output once (OpenBLAS zeroes C for beta = 0, then reads and
writes it again in its kernel): measured on ResNet-50's 1x1 layers (see
:mod:`._conv_select`). The products are the direct definition's, summed in order over R
with fused multiply-adds.
"""

# The function bodies are numba nopython code: numba types them, and numba's stubs
# cannot describe that to mypy.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._nb import jit

__all__ = ["product", "warm_up"]

#: Output channels of a register tile.
ROWS = 8
#: 16-float vectors of pixels of a register tile.
VECTORS = 2
#: Lanes of a vector.
LANES = 16
#: Floats of ``x`` one pixel block keeps in L2 (R rows by the block's pixels).
PANEL_FLOATS = 1 << 17


def _tile_intrinsic(rows: int, accumulate: bool) -> Any:
    """The register tile of ``rows`` output channels by :data:`VECTORS` vectors of pixels."""

    @intrinsic
    def tile(typingctx, f, f_off, f_ld, x, x_off, x_ld, depth, width, bias, b_off, y, y_off, y_ld):
        """``y[y_off + i y_ld + p] = bias[b_off + i] + sum_r f[f_off + i f_ld + r] x[x_off + r x_ld + p]``.

        For ``i < rows``, ``p < width`` (at most ``VECTORS * LANES``), ``r < depth`` (>= 1).
        """
        f32 = types.float32
        arrays = (f, x, bias, y)
        if not all(isinstance(a, types.Array) and a.dtype == f32 and a.ndim == 1 for a in arrays):
            return None
        sig = types.void(f, f_off, f_ld, x, x_off, x_ld, depth, width, bias, b_off, y, y_off, y_ld)

        def codegen(context, builder, signature, args):
            return _tile_code(context, builder, signature, args, rows, accumulate)

        return sig, codegen

    return tile


def _tile_code(context: Any, builder: Any, signature: Any, args: Any, rows: int, accumulate: bool) -> Any:
    vec = ir.VectorType(ir.FloatType(), LANES)
    i64, i32 = ir.IntType(64), ir.IntType(32)
    mask_t = ir.VectorType(ir.IntType(1), LANES)
    ptr_t = vec.as_pointer()

    def data(i: int) -> Any:
        return context.make_array(signature.args[i])(context, builder, args[i]).data

    def index(i: int) -> Any:
        return context.cast(builder, args[i], signature.args[i], types.intp)

    fp = builder.gep(data(0), [index(1)])
    xp = builder.gep(data(3), [index(4)])
    bp = builder.gep(data(8), [index(9)])
    yp = builder.gep(data(10), [index(11)])
    f_ld, x_ld, depth, width, y_ld = index(2), index(5), index(6), index(7), index(12)
    module = builder.module
    load = cgutils.get_or_insert_function(
        module, ir.FunctionType(vec, [ptr_t, i32, mask_t, vec]), "llvm.masked.load.v16f32.p0"
    )
    store = cgutils.get_or_insert_function(
        module, ir.FunctionType(ir.VoidType(), [vec, ptr_t, i32, mask_t]), "llvm.masked.store.v16f32.p0"
    )
    fma = cgutils.get_or_insert_function(module, ir.FunctionType(vec, [vec, vec, vec]), "llvm.fma.v16f32")
    lanes = ir.Constant(ir.VectorType(i64, LANES), list(range(LANES)))
    zero = ir.Constant(vec, [0.0] * LANES)

    def splat(value: Any, kind: Any) -> Any:
        one = builder.insert_element(ir.Constant(kind, ir.Undefined), value, i32(0))
        return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(i32, LANES), [0] * LANES))

    masks = [
        builder.icmp_signed("<", lanes, splat(builder.sub(width, i64(LANES * j)), ir.VectorType(i64, LANES)))
        for j in range(VECTORS)
    ]
    accs = []
    for i in range(rows):
        out = builder.gep(yp, [builder.mul(y_ld, i64(i))])
        if accumulate:
            # A later slice of the depth: start from the partial sums already in y.
            starts = [
                builder.call(
                    load, [builder.bitcast(builder.gep(out, [i64(LANES * j)]), ptr_t), i32(4), masks[j], zero]
                )
                for j in range(VECTORS)
            ]
        else:
            starts = [splat(builder.load(builder.gep(bp, [i64(i)])), vec)] * VECTORS
        accs.append([cgutils.alloca_once_value(builder, start) for start in starts])
    with cgutils.for_range(builder, depth) as loop:
        r = loop.index
        row = builder.gep(xp, [builder.mul(r, x_ld)])
        xv = [
            builder.call(
                load, [builder.bitcast(builder.gep(row, [i64(LANES * j)]), ptr_t), i32(4), masks[j], zero]
            )
            for j in range(VECTORS)
        ]
        for i in range(rows):
            weight = splat(builder.load(builder.gep(fp, [builder.add(r, builder.mul(f_ld, i64(i)))])), vec)
            for j in range(VECTORS):
                builder.store(builder.call(fma, [weight, xv[j], builder.load(accs[i][j])]), accs[i][j])
    for i in range(rows):
        out = builder.gep(yp, [builder.mul(y_ld, i64(i))])
        for j in range(VECTORS):
            where = builder.bitcast(builder.gep(out, [i64(LANES * j)]), ptr_t)
            builder.call(store, [builder.load(accs[i][j]), where, i32(4), masks[j]])
    return context.get_dummy_value()


_tile_block = _tile_intrinsic(ROWS, False)
_tile_row = _tile_intrinsic(1, False)
_add_block = _tile_intrinsic(ROWS, True)
_add_row = _tile_intrinsic(1, True)


@jit
def product(f, f_ld, x, x_ld, bias, y, y_ld, rows, depth, width, block, chunk):
    """``y[i, p] = bias[i] + sum_r f[i, r] x[r, p]`` for ``i < rows``, ``p < width``, ``r < depth``.

    1-D float32 arrays holding row-major matrices from element 0 with the given row
    strides (``f[i, r]`` is ``f[i * f_ld + r]``); ``bias`` has ``rows`` entries (zeros for
    none); ``block``: pixels per L2 block (a multiple of the tile width); ``chunk``: depth
    per pass (later passes add to y). ``depth >= 1``.
    A block's channel blocks run one after another over all its tiles (measured faster
    than every channel block on one tile at a time, which rereads the filter per tile).
    """
    step = LANES * VECTORS
    for p0 in range(0, width, block):
        p1 = min(width, p0 + block)
        for d0 in range(0, depth, chunk):
            d = min(chunk, depth - d0)
            k = 0
            while k < rows:
                full = k + ROWS <= rows
                for p in range(p0, p1, step):
                    n, at, fk, xk = min(step, p1 - p), k * y_ld + p, k * f_ld + d0, d0 * x_ld + p
                    if d0 == 0 and full:
                        _tile_block(f, fk, f_ld, x, xk, x_ld, d, n, bias, k, y, at, y_ld)
                    elif d0 == 0:
                        _tile_row(f, fk, f_ld, x, xk, x_ld, d, n, bias, k, y, at, y_ld)
                    elif full:
                        _add_block(f, fk, f_ld, x, xk, x_ld, d, n, bias, k, y, at, y_ld)
                    else:
                        _add_row(f, fk, f_ld, x, xk, x_ld, d, n, bias, k, y, at, y_ld)
                k += ROWS if full else 1


def pixel_block(depth: int) -> int:
    """Pixels per L2 block for ``depth`` inner steps: a multiple of the tile width, 32 to 512."""
    step = LANES * VECTORS
    return max(step, min(512, PANEL_FLOATS // max(1, depth) // step * step))


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel now, and check it on a small product."""
    rng = np.random.default_rng(0)
    f = rng.standard_normal((9, 3)).astype(np.float32)
    x = rng.standard_normal((3, 37)).astype(np.float32)
    bias = rng.standard_normal(9).astype(np.float32)
    y = np.zeros((9, 37), dtype=np.float32)
    product(f.ravel(), 3, x.ravel(), 37, bias, y.ravel(), 37, 9, 3, 37, 32, 2)
    want = f.astype(np.float64) @ x.astype(np.float64) + bias[:, None]
    if not np.allclose(y, want, rtol=1e-5, atol=1e-5):
        raise RuntimeError("the compiled convolution product gives wrong results here")

"""Compiled float32 products for the convolutions: ``y = f @ x + bias``, read in place.

``f`` [K, R] (filter rows), ``x`` [R, W] (an image's pixels or im2col columns), ``y``
[K, W], each with its own row stride. The filter is first copied into panels of
:data:`ROWS` output channels (:func:`pack_filter`: ``R`` groups of ``ROWS`` values, the
bias beside them, channels past K zero), so that the microkernel reads its weights
from one pointer at fixed offsets. The microkernel (:func:`_tile_intrinsic`, written in
LLVM IR since numba has no vector type) keeps ``rows`` output channels by ``vectors``
vectors of 16 pixels in registers, starts them at the bias, and for each of the R
inner steps loads the pixels' vectors once and broadcasts one weight per channel:
:data:`ROWS` channels by :data:`VECTORS` vectors (24 accumulators; 24 fused
multiply-adds for 11 loads). :func:`product` reads inner step ``r``'s pixels from row
``r`` of ``x``; :func:`product_table` from ``offsets[r]`` past the tile's first pixel
(the taps of a convolution in a phase-split copy of its input, :mod:`._conv_direct`).
The lanes past the width are 16-bit masks built once per tile (kept in mask
registers; vector compares in the loop had cost vector registers and spills).

Each inner step of the GEMM tile also prefetches its rows' pixels two tiles ahead
into L1 (:data:`PREFETCH_AHEAD`). The last pixels of a block go to a tile of one or two
vectors where they need no more: widths just past a multiple of 48 (ResNet's 14x14 and
7x7 images: 196 = 4 x 48 + 4, 49 = 48 + 1) had computed two vectors of masked lanes per
tile row. CPU time of one thread, best of 9, old and new interleaved in one process:
256 -> 1024 at 14x14 93 -> 112 GFLOP/s, 1024 -> 256 93 -> 112, 512 -> 2048 at 7x7
47 -> 62, 128 -> 512 at 28x28 119 -> 136, 64 -> 256 at 56x56 126 -> 139 (a 16-pixel tail).

A GEMM tile can also finish a convolution's epilogue as it stores (``mode``: add a
residual laid out as the output, then ReLU), so that a fused ``conv + residual + ReLU``
needs no second pass over the output: ResNet-50's 1x1 layers at batch 1 through the
backend, interleaved, busy machine: 0.88-0.93 of the time with a residual, 0.92-1.0
with ReLU alone.

The last vector of a tile and the channels past K are masked, so nothing outside the
operands is read or written. Measured (CPU time of one thread, best of 9, the other
core busy; against a one-thread 1024^3 sgemm of 110-130 GFLOP/s): the packed 8 x 3
tile reaches 76-95 GFLOP/s on ResNet-50's 256 -> 64 1x1 product where the previous
8 x 2 tile on the filter in place reached 67-74 (the filter's eight rows were eight
strided streams with an address add each: 2.4 instructions per multiply-add, 1.6
now); 64 -> 256 88-91 vs 79-81. Packing the pixels into tile-major panels too, or
running every channel block over one tile before the next (pixels kept in L1), was
slower or equal. The products are the direct definition's, summed in order over R
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

from ._llvm import TileIR
from ._nb import jit, transpose8

__all__ = ["pack_filter", "pixel_block", "product", "product_packed", "product_table", "warm_up", "ROWS"]

#: Output channels of the GEMM's register tile (and of a filter panel of :func:`pack_filter`).
ROWS = 8
#: 16-float vectors of pixels of the GEMM's register tile.
VECTORS = 3
#: Lanes of a vector.
LANES = 16
#: ``mode`` bits of the GEMM tiles' epilogue: add a residual laid out as the output, then ReLU.
ADD_RESIDUAL = 1
RELU = 2
#: Floats of ``x`` one pixel block keeps in L2 (R rows by the block's pixels).
PANEL_FLOATS = 1 << 17
#: Floats ahead of each inner step's pixels that the GEMM tile prefetches into L1: the
#: same rows two tiles on. Its rows are an image's channels, thousands of floats apart,
#: which no hardware prefetcher follows (ResNet's 256 -> 64 1x1 product, CPU time of one
#: thread, interleaved: 48 ahead 102-105 GFLOP/s, 96 107-111, 144-192 103-107, none
#: 91-98; 64 -> 256 unchanged; the direct kernel's table tile gained nothing measurable).
PREFETCH_AHEAD = 2 * LANES * VECTORS


def _tile_intrinsic(rows: int, vectors: int, accumulate: bool, table: bool = False) -> Any:
    """The register tile of ``rows`` output channels by ``vectors`` vectors of pixels.

    A ``table`` tile reads its inner steps' pixels through ``offsets`` and stores each
    vector's lanes compressed (see :func:`product_table`).
    """

    @intrinsic
    def tile(
        typingctx, fp, f_off, x, x_off, x_ld, offsets, depth, width, valid, bias, b_off, y, y_off, y_ld, st,
        r, mode,
    ):  # fmt: skip
        """``y[y_off + i y_ld + p] = bias[b_off + i] + sum_r fp[f_off + r rows + i] x[x_off + row(r) + p]``.

        For ``i < valid`` (at most ``rows``), ``p < width`` (at most ``vectors * LANES``),
        ``r < depth`` (>= 1); ``row(r)`` is ``offsets[r]`` for a table tile, else
        ``r x_ld``. An accumulating tile starts from ``y`` instead of the bias. A table
        tile stores vector ``j`` of channel ``i`` compressed: its lanes set in
        ``st[vectors + j]`` to consecutive places from ``y[y_off + i y_ld + st[j]]``.
        Before a (non-table) tile stores, ``mode`` bit :data:`ADD_RESIDUAL` adds
        ``r[y_off + i y_ld + p]`` (the residual, laid out as ``y``) and bit :data:`RELU`
        applies ReLU (``v > 0 ? v : 0``: NaN and -0 give +0, as the ``unary`` RELU does).
        """
        f32 = types.float32
        arrays = (fp, x, bias, y, r)
        if not all(isinstance(a, types.Array) and a.dtype == f32 and a.ndim == 1 for a in arrays):
            return None
        tables = (offsets, st)
        if not all(isinstance(a, types.Array) and a.dtype == types.int64 and a.ndim == 1 for a in tables):
            return None
        sig = types.void(
            fp, f_off, x, x_off, x_ld, offsets, depth, width, valid, bias, b_off, y, y_off, y_ld, st, r, mode
        )

        def codegen(context, builder, signature, args):
            return _tile_code(context, builder, signature, args, (rows, vectors, accumulate, table))

        return sig, codegen

    return tile


def _tile_code(context: Any, builder: Any, signature: Any, args: Any, shape: tuple[Any, ...]) -> Any:
    rows, vectors, accumulate, table = shape
    t = TileIR(context, builder, signature, args)
    vec, i64, i32, byte_ptr = t.vec, t.i64, t.i32, ir.IntType(8).as_pointer()
    fp, xp, offsets, bp, yp = t.at(0, 1), t.at(2, 3), t.data(5), t.at(9, 10), t.at(11, 12)
    x_ld, depth, width, valid, y_ld = t.index(4), t.index(6), t.index(7), t.index(8), t.index(13)
    load, store, fma, prefetch, zero = t.load, t.store, t.fma, t.prefetch, t.zero
    splat, vector_at = t.splat, t.vector_at
    none = ir.Constant(t.mask_t, [0] * LANES)
    masks = _lane_masks(builder, width, vectors)
    # Channels past ``valid`` are computed (their packed weights are zero) but never stored.
    row_masks = [
        [builder.select(builder.icmp_signed("<", i64(i), valid), masks[j], none) for j in range(vectors)]
        for i in range(rows)
    ]
    accs = []
    for i in range(rows):
        out = builder.gep(yp, [builder.mul(y_ld, i64(i))])
        if accumulate:
            starts = [
                builder.call(load, [vector_at(out, j), i32(4), row_masks[i][j], zero]) for j in range(vectors)
            ]
        else:
            starts = [splat(builder.load(builder.gep(bp, [i64(i)])), vec)] * vectors
        accs.append([cgutils.alloca_once_value(builder, start) for start in starts])
    with cgutils.for_range(builder, depth) as loop:
        r = loop.index
        step = builder.load(builder.gep(offsets, [r])) if table else builder.mul(r, x_ld)
        row = builder.gep(xp, [step])
        weights = builder.gep(fp, [builder.mul(r, i64(rows))])
        xv = [builder.call(load, [vector_at(row, j), i32(4), masks[j], zero]) for j in range(vectors)]
        if not table:
            for j in range(vectors):
                ahead = builder.gep(row, [i64(PREFETCH_AHEAD + LANES * j)])
                builder.call(prefetch, [builder.bitcast(ahead, byte_ptr), i32(0), i32(3), i32(1)])
        for i in range(rows):
            weight = splat(builder.load(builder.gep(weights, [i64(i)])), vec)
            for j in range(vectors):
                builder.store(builder.call(fma, [weight, xv[j], builder.load(accs[i][j])]), accs[i][j])
    if table:
        _compressed_stores(t, (yp, y_ld, valid, t.data(14)), accs, vectors)
        return context.get_dummy_value()
    mode = t.index(16)
    add_r = builder.icmp_signed("!=", builder.and_(mode, i64(ADD_RESIDUAL)), i64(0))
    relu = builder.icmp_signed("!=", builder.and_(mode, i64(RELU)), i64(0))
    rp = t.at(15, 12)
    for i in range(rows):
        out = builder.gep(yp, [builder.mul(y_ld, i64(i))])
        res = builder.gep(rp, [builder.mul(y_ld, i64(i))])
        for j in range(vectors):
            acc = builder.load(accs[i][j])
            # The residual's lanes are read only where they are stored and only when asked for.
            rmask = builder.select(add_r, row_masks[i][j], none)
            rv = builder.call(load, [vector_at(res, j), i32(4), rmask, zero])
            acc = builder.select(add_r, builder.fadd(acc, rv), acc)
            acc = builder.select(relu, builder.select(builder.fcmp_ordered(">", acc, zero), acc, zero), acc)
            builder.call(store, [acc, vector_at(out, j), i32(4), row_masks[i][j]])
    return context.get_dummy_value()


def _lane_masks(builder: Any, width: Any, vectors: int) -> list[Any]:
    """Lanes inside ``width`` per vector, as 16-bit integers (mask registers, not vectors, in the loop)."""
    i64 = ir.IntType(64)
    masks = []
    for j in range(vectors):
        count = builder.sub(width, i64(LANES * j))
        count = builder.select(builder.icmp_signed("<", count, i64(0)), i64(0), count)
        count = builder.select(builder.icmp_signed(">", count, i64(LANES)), i64(LANES), count)
        bits = builder.trunc(builder.sub(builder.shl(i64(1), count), i64(1)), ir.IntType(LANES))
        masks.append(builder.bitcast(bits, ir.VectorType(ir.IntType(1), LANES)))
    return masks


def _compressed_stores(t: TileIR, where: tuple[Any, ...], accs: Any, vectors: int) -> None:
    """Store each accumulator's lanes set in its 16-bit mask to consecutive floats (vcompressps)."""
    yp, y_ld, valid, st = where
    builder, vec, i64, mask_t, store = t.builder, t.vec, t.i64, t.mask_t, t.store
    fnty = ir.FunctionType(ir.VoidType(), [vec, ir.FloatType().as_pointer(), mask_t])
    compress = cgutils.get_or_insert_function(builder.module, fnty, "llvm.masked.compressstore.v16f32")
    none = ir.Constant(mask_t, [0] * LANES)
    starts = [builder.load(builder.gep(st, [i64(j)])) for j in range(vectors)]
    bits = [builder.load(builder.gep(st, [i64(vectors + j)])) for j in range(vectors)]
    masks = [builder.bitcast(builder.trunc(b, ir.IntType(LANES)), mask_t) for b in bits]
    # A vector with every lane kept is one run of output: a plain (masked) store, which
    # costs a fraction of a compressing one.
    full = [builder.icmp_signed("==", b, i64((1 << LANES) - 1)) for b in bits]
    for i, row in enumerate(accs):
        out = builder.gep(yp, [builder.mul(y_ld, i64(i))])
        inside = builder.icmp_signed("<", i64(i), valid)
        for j, acc in enumerate(row):
            mask = builder.select(inside, masks[j], none)
            at = builder.gep(out, [starts[j]])
            with builder.if_else(full[j]) as (whole, part):
                with whole:
                    builder.call(
                        store,
                        [builder.load(acc), builder.bitcast(at, t.ptr_t), t.i32(4), mask],
                    )
                with part:
                    builder.call(compress, [builder.load(acc), at, mask])


_gemm_tile = _tile_intrinsic(ROWS, VECTORS, False)
_gemm_add = _tile_intrinsic(ROWS, VECTORS, True)
# Narrower tiles for the last pixels of a block, so that a width just past a multiple of
# the tile's (ResNet's 14x14 and 7x7 images: 196 = 4 x 48 + 4, 49 = 48 + 1) does not
# compute two or three vectors of masked lanes per tile row.
_gemm_tile2 = _tile_intrinsic(ROWS, 2, False)
_gemm_add2 = _tile_intrinsic(ROWS, 2, True)
_gemm_tile1 = _tile_intrinsic(ROWS, 1, False)
_gemm_add1 = _tile_intrinsic(ROWS, 1, True)
_table_tile = _tile_intrinsic(ROWS, VECTORS, False, True)


@jit
def pack_filter(f, f_ld, bias, rows, depth, panel, packed, pbias):
    """Filter panels: ``packed[(b depth + r) panel + i] = f[(b panel + i) f_ld + r]``, bias likewise.

    ``f`` [rows, depth] at row stride ``f_ld`` and ``bias`` (``rows`` values) as 1-D
    float32; panels of ``panel`` channels, zeros past ``rows``. Whole panels of 8 go
    through 8 x 8 transposes in registers (the scalar loop wrote 8-float-strided and
    ran at a quarter of a copy's speed: 35 us of a 225 us batch-1 task at 1024 deep).
    """
    blocks = (rows + panel - 1) // panel
    for b in range(blocks):
        k0 = b * panel
        start = 0
        if panel == 8 and k0 + 8 <= rows:
            start = depth // 8 * 8
            for r in range(0, start, 8):
                transpose8(f, k0 * f_ld + r, f_ld, packed, (b * depth + r) * 8, 8)
        for i in range(panel):
            k = k0 + i
            pbias[k] = bias[k] if k < rows else np.float32(0.0)
            if k < rows:
                for r in range(start, depth):
                    packed[(b * depth + r) * panel + i] = f[k * f_ld + r]
            else:
                for r in range(start, depth):
                    packed[(b * depth + r) * panel + i] = np.float32(0.0)


@jit
def product(f, f_ld, x, x_ld, bias, y, y_ld, rows, depth, width, block, chunk):
    """``y[i, p] = bias[i] + sum_r f[i, r] x[r, p]`` for ``i < rows``, ``p < width``, ``r < depth``.

    1-D float32 arrays holding row-major matrices from element 0 with the given row
    strides (``f[i, r]`` is ``f[i * f_ld + r]``); ``bias`` has ``rows`` entries (zeros for
    none); ``block``: pixels per L2 block (a multiple of the tile width); ``chunk``: depth
    per pass (later passes add to y). ``depth >= 1``. The filter is packed on every call
    (:func:`pack_filter`); :func:`product_packed` takes packed panels.
    """
    blocks = (rows + ROWS - 1) // ROWS
    packed = np.empty(blocks * ROWS * depth, dtype=np.float32)
    pbias = np.empty(blocks * ROWS, dtype=np.float32)
    pack_filter(f, f_ld, bias, rows, depth, ROWS, packed, pbias)
    product_packed(packed, pbias, 0, rows, depth, x, 0, x_ld, y, 0, y_ld, width, block, chunk, y, 0)


@jit
def product_packed(pk, pb, panel0, rows, depth, x, x0, x_ld, y, y0, y_ld, width, block, chunk, r, mode):
    """:func:`product` on packed filter panels ``panel0 ..``, ``x`` and ``y`` read from ``x0`` / ``y0``.

    Output channel ``i`` of this product is channel ``panel0 * ROWS + i`` of the packed
    filter and its bias; ``x[q, p]`` is ``x[x0 + q x_ld + p]``, ``y[i, p]`` is
    ``y[y0 + i y_ld + p]``. A block's channel panels run one after another over all its
    tiles (measured faster than every panel on one tile at a time). The last pass over
    the depth applies the epilogue ``mode`` (:data:`ADD_RESIDUAL`, :data:`RELU`; 0 for
    none) as it stores, the residual ``r`` indexed as ``y``.
    """
    blocks = (rows + ROWS - 1) // ROWS
    no = np.empty(1, dtype=np.int64)  # no offset table / compressed stores
    step = LANES * VECTORS
    for p0 in range(0, width, block):
        p1 = min(width, p0 + block)
        for d0 in range(0, depth, chunk):
            d = min(chunk, depth - d0)
            m = mode if d0 + d >= depth else 0
            for b in range(blocks):
                valid = min(ROWS, rows - b * ROWS)
                fk = ((panel0 + b) * depth + d0) * ROWS
                k0 = (panel0 + b) * ROWS
                for p in range(p0, p1, step):
                    n, at, xk = min(step, p1 - p), y0 + b * ROWS * y_ld + p, x0 + d0 * x_ld + p
                    if n > 2 * LANES:
                        if d0 == 0:
                            _gemm_tile(pk, fk, x, xk, x_ld, no, d, n, valid, pb, k0, y, at, y_ld, no, r, m)
                        else:
                            _gemm_add(pk, fk, x, xk, x_ld, no, d, n, valid, pb, k0, y, at, y_ld, no, r, m)
                    elif n > LANES:
                        if d0 == 0:
                            _gemm_tile2(pk, fk, x, xk, x_ld, no, d, n, valid, pb, k0, y, at, y_ld, no, r, m)
                        else:
                            _gemm_add2(pk, fk, x, xk, x_ld, no, d, n, valid, pb, k0, y, at, y_ld, no, r, m)
                    elif d0 == 0:
                        _gemm_tile1(pk, fk, x, xk, x_ld, no, d, n, valid, pb, k0, y, at, y_ld, no, r, m)
                    else:
                        _gemm_add1(pk, fk, x, xk, x_ld, no, d, n, valid, pb, k0, y, at, y_ld, no, r, m)


@jit
def product_table(packed, pbias, rows, depth, x, x0, offsets, y, y_ld, width, line, keep):
    """``y[i y_ld + o(p)] = pbias[i] + sum_r w[i, r] x[x0 + p + offsets[r]]``, ``w`` from :func:`pack_filter`.

    For ``i < rows`` and the pixels ``p < width`` of a grid of ``line`` pixels a row
    whose first ``keep`` of each row are kept: ``o(p) = (p // line) keep + p % line``
    (the rows of the output, contiguous). Inner step ``r`` reads the pixels at
    ``offsets[r]`` from ``x0`` (a convolution's taps in a copy of its input laid out so
    that every tap of a row of output pixels is a unit-stride segment); the kept lanes
    of each vector are stored compressed, so the dropped columns are never written.
    ``packed`` / ``pbias`` from :func:`pack_filter` with panels of :data:`ROWS`.
    """
    blocks = (rows + ROWS - 1) // ROWS
    step = LANES * VECTORS
    tiles = (width + step - 1) // step
    stores = np.zeros(tiles * 2 * VECTORS, dtype=np.int64)
    for t in range(tiles):
        for j in range(VECTORS):
            first, bits = -1, 0
            for lane in range(LANES):
                p = t * step + j * LANES + lane
                if p < width and p % line < keep:
                    bits |= 1 << lane
                    if first < 0:
                        first = (p // line) * keep + p % line
            stores[t * 2 * VECTORS + j] = max(first, 0) - (t * step // line) * keep - (t * step) % line
            stores[t * 2 * VECTORS + VECTORS + j] = bits
    for b in range(blocks):
        valid = min(ROWS, rows - b * ROWS)
        fk = b * depth * ROWS
        for t in range(tiles):
            p = t * step
            n = min(step, width - p)
            at = b * ROWS * y_ld + (p // line) * keep + p % line
            st = stores[t * 2 * VECTORS : (t + 1) * 2 * VECTORS]
            k0 = b * ROWS
            _table_tile(packed, fk, x, x0 + p, 0, offsets, depth, n, valid, pbias, k0, y, at, y_ld, st, y, 0)


def pixel_block(depth: int) -> int:
    """Pixels per L2 block for ``depth`` inner steps: a multiple of the tile width, 48 to 576."""
    step = LANES * VECTORS
    return max(step, min(576, PANEL_FLOATS // max(1, depth) // step * step))


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels now, and check the product on a small case."""
    rng = np.random.default_rng(0)
    f = rng.standard_normal((9, 3)).astype(np.float32)
    x = rng.standard_normal((3, 37)).astype(np.float32)
    bias = rng.standard_normal(9).astype(np.float32)
    y = np.zeros((9, 37), dtype=np.float32)
    product(f.ravel(), 3, x.ravel(), 37, bias, y.ravel(), 37, 9, 3, 37, 48, 2)
    want = f.astype(np.float64) @ x.astype(np.float64) + bias[:, None]
    if not np.allclose(y, want, rtol=1e-5, atol=1e-5):
        raise RuntimeError("the compiled convolution product gives wrong results here")
    packed = np.empty(16 * 3, dtype=np.float32)
    pbias = np.empty(16, dtype=np.float32)
    pack_filter(f.ravel(), 3, bias, 9, 3, ROWS, packed, pbias)
    y[...] = 0
    taps = np.arange(3, dtype=np.int64) * 37
    product_table(packed, pbias, 9, 3, x.ravel(), 0, taps, y.ravel(), 37, 37, 37, 37)
    if not np.allclose(y, want, rtol=1e-5, atol=1e-5):
        raise RuntimeError("the compiled table product gives wrong results here")

"""A compiled float32 product for dense layers: ``y (+)= x @ w``, every operand read in place.

``x`` [rows, depth] (a batch of activations, any element strides), ``w`` [depth, width]
(weights with contiguous rows), ``y`` [rows, width] (contiguous rows). The microkernel
(:func:`_tile_code`, LLVM IR since numba has no vector type) keeps :data:`ROWS` rows of
``y`` by :data:`VECTORS` vectors of 16 columns in 24 registers and, per inner step,
broadcasts one ``x`` value per row and loads the ``w`` row's vectors once: 24 fused
multiply-adds for 10 loads (the compiled loop is exactly that: 4 masked loads, 6
broadcasts, 24 ``vfmadd231ps``). The last vector of a panel is a masked load and store,
so nothing outside the operands is touched; rows left over from the 6-row tiles go in
tiles of 2, then 1.

The driver walks panels of :data:`PANEL` columns; each panel is sliced by :data:`CHUNK`
inner steps and every block of rows runs over a slice before the next, so the slice
stays in L2 while all rows read it. It is fast when ``w``'s rows are short and
contiguous, i.e. when ``w`` is stored panel by panel (a batched GEMM over panels, see
:mod:`._gemm_dense`): measured on one thread, 128 rows x 768 deep, 95-120 GFLOP/s on
panels against OpenBLAS's 83-87 on the same matrix as one GEMM, and 143 GFLOP/s with
everything in cache. Read in place from one wide row-major matrix it is slower than
OpenBLAS (rows 12 KB apart share cache sets: 35 GFLOP/s at 3072 columns), which is why
plain GEMMs stay on BLAS.

:func:`product_rows` runs the same tiles over the whole depth for ``x`` of contiguous
rows streamed from memory (a convolution's filter rows, ``w`` an image's pixels: the 1x1
layers of small images), the tiles' prefetch hints pointed at the next tile's rows of
``x``: ResNet-50's 512 -> 2048 1x1 layer at 7x7, a 512-channel block, one thread, cold,
442 us against 551 us with :func:`product` (BLAS 632 us).

Products are summed in order over the depth with fused multiply-adds; ``accumulate``
starts from the values in ``y`` (BLAS ``beta = 1``), otherwise ``y`` is only written
(``beta = 0``: what ``y`` held, NaN included, is never read).
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
from ._nb import jit

__all__ = ["CHUNK", "PANEL", "ROWS", "batched", "product", "product_rows", "warm_up"]

#: Rows of ``y`` in a register tile.
ROWS = 6
#: 16-float vectors of columns in a register tile.
VECTORS = 4
#: Lanes of a vector.
LANES = 16
#: Columns of ``w`` per panel (one register tile wide).
PANEL = VECTORS * LANES
#: Inner steps per slice of a panel (a slice of ``CHUNK x PANEL`` floats stays in L2).
CHUNK = 768


def _tile_intrinsic(rows: int, accumulate: bool, ahead_x: bool = False) -> Any:
    """The register tile of ``rows`` rows of ``y`` by :data:`VECTORS` vectors of columns.

    ``ahead_x``: the prefetch hint's offsets are into ``x`` instead of ``w``.
    """

    @intrinsic
    def tile(typingctx, x, x_off, x_rs, x_cs, w, w_off, w_ld, depth, width, y, y_off, y_ld, pf_off, pf_ld):
        """``y[y_off + i y_ld + p] (+)= sum_r x[x_off + i x_rs + r x_cs] w[w_off + r w_ld + p]``.

        For ``i < rows``, ``p < width`` (at most ``VECTORS * LANES``), ``r < depth`` (>= 1).
        Step ``r`` also asks for the line of ``w`` at ``pf_off + r pf_ld`` to be brought
        into L2 (a hint: the next panel, while this one is computed).
        """
        f32 = types.float32
        arrays = (x, w, y)
        if not all(isinstance(a, types.Array) and a.dtype == f32 and a.ndim == 1 for a in arrays):
            return None
        sig = types.void(x, x_off, x_rs, x_cs, w, w_off, w_ld, depth, width, y, y_off, y_ld, pf_off, pf_ld)

        def codegen(context, builder, signature, args):
            return _tile_code(context, builder, signature, args, rows, accumulate, ahead_x)

        return sig, codegen

    return tile


def _tile_code(
    context: Any, builder: Any, signature: Any, args: Any, rows: int, accumulate: bool, ahead_x: bool
) -> Any:
    t = TileIR(context, builder, signature, args)
    vec, i64, i32, i8p = t.vec, t.i64, t.i32, ir.IntType(8).as_pointer()
    xp, x_rs, x_cs = t.at(0, 1), t.index(2), t.index(3)
    wp, w_ld, depth, width = t.at(4, 5), t.index(6), t.index(7), t.index(8)
    yp, y_ld = t.at(9, 10), t.index(11)
    pfp, pf_ld = t.at(0 if ahead_x else 4, 12), t.index(13)
    load, store, fma, prefetch, zero = t.load, t.store, t.fma, t.prefetch, t.zero
    splat, vector_at = t.splat, t.vector_at
    lanes = ir.Constant(ir.VectorType(i64, LANES), list(range(LANES)))

    masks = [
        builder.icmp_signed("<", lanes, splat(builder.sub(width, i64(LANES * j)), ir.VectorType(i64, LANES)))
        for j in range(VECTORS)
    ]
    accs = []
    for i in range(rows):
        out = builder.gep(yp, [builder.mul(y_ld, i64(i))])
        if accumulate:
            starts = [builder.call(load, [vector_at(out, j), i32(4), masks[j], zero]) for j in range(VECTORS)]
        else:
            starts = [zero] * VECTORS
        accs.append([cgutils.alloca_once_value(builder, start) for start in starts])
    rows_x = [builder.gep(xp, [builder.mul(x_rs, i64(i))]) for i in range(rows)]
    with cgutils.for_range(builder, depth) as loop:
        r = loop.index
        ahead = builder.bitcast(builder.gep(pfp, [builder.mul(r, pf_ld)]), i8p)
        builder.call(prefetch, [ahead, i32(0), i32(2), i32(1)])
        row = builder.gep(wp, [builder.mul(r, w_ld)])
        wv = [builder.call(load, [vector_at(row, j), i32(4), masks[j], zero]) for j in range(VECTORS)]
        at = builder.mul(r, x_cs)
        for i in range(rows):
            value = splat(builder.load(builder.gep(rows_x[i], [at])), vec)
            for j in range(VECTORS):
                builder.store(builder.call(fma, [value, wv[j], builder.load(accs[i][j])]), accs[i][j])
    for i in range(rows):
        out = builder.gep(yp, [builder.mul(y_ld, i64(i))])
        for j in range(VECTORS):
            builder.call(store, [builder.load(accs[i][j]), vector_at(out, j), i32(4), masks[j]])
    return context.get_dummy_value()


_set_block = _tile_intrinsic(ROWS, False)
_set_pair = _tile_intrinsic(2, False)
_set_row = _tile_intrinsic(1, False)
_add_block = _tile_intrinsic(ROWS, True)
_add_pair = _tile_intrinsic(2, True)
_add_row = _tile_intrinsic(1, True)
_ahead_set_block = _tile_intrinsic(ROWS, False, True)
_ahead_set_pair = _tile_intrinsic(2, False, True)
_ahead_set_row = _tile_intrinsic(1, False, True)
_ahead_add_block = _tile_intrinsic(ROWS, True, True)
_ahead_add_pair = _tile_intrinsic(2, True, True)
_ahead_add_row = _tile_intrinsic(1, True, True)


@jit
def _rows(x, xi, x_rs, x_cs, w, wi, w_ld, d, n, y, yi, y_ld, rows, add, ahead):
    """Every block of ``rows`` rows over one slice of a panel (tiles of 6, then 2, then 1 rows).

    The first :data:`VECTORS` tiles also prefetch the slice of the next panel at ``ahead``
    (one line of it per step; it has ``VECTORS`` lines a row).
    """
    i = 0
    t = 0
    while i < rows:
        pf = ahead + LANES * (t % VECTORS)
        t += 1
        left = rows - i
        step = ROWS if left >= ROWS else 2 if left >= 2 else 1
        xr, yr = xi + i * x_rs, yi + i * y_ld
        if step == ROWS and add:
            _add_block(x, xr, x_rs, x_cs, w, wi, w_ld, d, n, y, yr, y_ld, pf, w_ld)
        elif step == ROWS:
            _set_block(x, xr, x_rs, x_cs, w, wi, w_ld, d, n, y, yr, y_ld, pf, w_ld)
        elif step == 2 and add:
            _add_pair(x, xr, x_rs, x_cs, w, wi, w_ld, d, n, y, yr, y_ld, pf, w_ld)
        elif step == 2:
            _set_pair(x, xr, x_rs, x_cs, w, wi, w_ld, d, n, y, yr, y_ld, pf, w_ld)
        elif add:
            _add_row(x, xr, x_rs, x_cs, w, wi, w_ld, d, n, y, yr, y_ld, pf, w_ld)
        else:
            _set_row(x, xr, x_rs, x_cs, w, wi, w_ld, d, n, y, yr, y_ld, pf, w_ld)
        i += step


@jit
def product(x, x_rs, x_cs, w, w_off, w_ld, y, y_off, y_ld, rows, depth, width, accumulate, after):
    """``y[y_off + i y_ld + p] (+)= sum_r x[i x_rs + r x_cs] w[w_off + r w_ld + p]``.

    For ``i < rows``, ``p < width``, ``r < depth`` (>= 1): 1-D float32 arrays;
    ``accumulate`` adds to ``y`` instead of overwriting it; ``after`` is where the
    weights read next begin (prefetched during the last panel).
    """
    for p in range(0, width, PANEL):
        n = min(PANEL, width - p)
        for d0 in range(0, depth, CHUNK):
            d = min(CHUNK, depth - d0)
            add = accumulate or d0 > 0
            wi = w_off + d0 * w_ld + p
            if d0 + d < depth:
                ahead = wi + d * w_ld  # the next slice of this panel
            else:
                ahead = w_off + p + PANEL if p + PANEL < width else after
            _rows(x, d0 * x_cs, x_rs, x_cs, w, wi, w_ld, d, n, y, y_off + p, y_ld, rows, add, ahead)


@jit
def product_rows(x, x_off, w, w_ld, y, y_off, y_ld, rows, depth, width, accumulate):
    """``y[y_off + i y_ld + p] (+)= sum_r x[x_off + i depth + r] w[r w_ld + p]`` over the whole depth.

    For ``i < rows``, ``p < width``, ``r < depth`` (>= 1): ``x``'s rows contiguous and
    back to back (a block of filter rows, streamed from memory once), ``w`` small (an
    image's pixels, kept in cache); ``accumulate`` adds to ``y`` (a bias written there). While a
    tile runs, each inner step asks for the next tile's ``x`` rows (:data:`ROWS` floats a
    step cover them), which no hardware prefetcher follows across the tile's rows.
    """
    for p in range(0, width, PANEL):
        n = min(PANEL, width - p)
        i = 0
        while i < rows:
            left = rows - i
            step = ROWS if left >= ROWS else 2 if left >= 2 else 1
            xr, yr = x_off + i * depth, y_off + p + i * y_ld
            pf = x_off + min(i + step, rows - 1) * depth
            if step == ROWS and accumulate:
                _ahead_add_block(x, xr, depth, 1, w, p, w_ld, depth, n, y, yr, y_ld, pf, ROWS)
            elif step == ROWS:
                _ahead_set_block(x, xr, depth, 1, w, p, w_ld, depth, n, y, yr, y_ld, pf, ROWS)
            elif step == 2 and accumulate:
                _ahead_add_pair(x, xr, depth, 1, w, p, w_ld, depth, n, y, yr, y_ld, pf, 2)
            elif step == 2:
                _ahead_set_pair(x, xr, depth, 1, w, p, w_ld, depth, n, y, yr, y_ld, pf, 2)
            elif accumulate:
                _ahead_add_row(x, xr, depth, 1, w, p, w_ld, depth, n, y, yr, y_ld, pf, 1)
            else:
                _ahead_set_row(x, xr, depth, 1, w, p, w_ld, depth, n, y, yr, y_ld, pf, 1)
            i += step


@jit
def batched(x, x_rs, x_cs, w, w_ld, w_step, y, y_ld, y_step, rows, depth, width, first, last, accumulate):
    """:func:`product` for the matrices ``first`` to ``last - 1`` of a batch sharing ``x``.

    Matrix ``j`` of ``w`` starts at element ``j * w_step``, its result at ``j * y_step``.
    """
    for j in range(first, last):
        after = (j + 1) * w_step if j + 1 < last else j * w_step
        product(
            x, x_rs, x_cs, w, j * w_step, w_ld, y, j * y_step, y_ld, rows, depth, width, accumulate, after
        )


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel now, and check it on a small product."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((11, 5)).astype(np.float32)
    w = rng.standard_normal((5, 83)).astype(np.float32)
    y = np.zeros((11, 83), dtype=np.float32)
    batched(x.ravel(), 5, 1, w.ravel(), 83, 0, y.ravel(), 83, 0, 11, 5, 83, 0, 1, False)
    want = x.astype(np.float64) @ w.astype(np.float64)
    if not np.allclose(y, want, rtol=1e-5, atol=1e-5):
        raise RuntimeError("the compiled dense-layer product gives wrong results here")

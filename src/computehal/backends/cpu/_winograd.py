"""Winograd F(4x4, 3x3) convolution kernels for float32 (numba).

A 3x3 stride-1 convolution computes each 4x4 block ("tile") of output pixels from the
6x6 input patch under it. Winograd's minimal filtering algorithm F(4x4, 3x3) writes the
tile as ``A^T [(G g G^T) o (B^T d B)] A`` (``o``: element-wise product of 6x6 matrices,
``d`` the patch, ``g`` the 3x3 filter), so that summed over the input channels, each
of the 36 transformed positions is one GEMM::

    M[xi] (tiles x K) = V[xi] (tiles x C) @ U[xi] (C x K)

with ``V = B^T d B`` per tile and input channel and ``U = G g G^T`` per filter. That is
36 multiply-adds per tile and channel pair instead of the direct definition's 144
(4x fewer), at the cost of the three linear transforms, which touch each value a few
times and are memory-bound. The interpolation points are 0, +-1, +-2 and infinity (the
matrices below, as in Lavin and Gray, "Fast Algorithms for Convolutional Neural
Networks", 2016).

The same bilinear form gives the filter gradient: summing ``G^T [(A dY A^T) o V] G``
over tiles, the tile sum moves inside, so each transformed position is again one GEMM
(``dU[xi] (C x K) = V[xi]^T @ (A dY A^T)[xi]``, reduced over every tile of every image)
followed by one small inverse transform per filter. The data gradient is the forward
convolution of the output gradient with the flipped, transposed filter.

Rounding: the transforms add and scale values of one 6x6 patch, so an output's error
is a few times its direct-definition error, relative to the patch's magnitude rather
than only its own window's (``tests/test_cpu_perf.py`` measures it against the direct
definition under the conformance kit's tolerance). A non-finite value would spread to
every output of its tile (``inf - inf``), so every kernel reports whether all of its
inputs were finite, and the caller takes an exact algorithm otherwise.

Layout: the transforms are vectorised over channels (8 x 8 register transposes move
rows between NCHW and channels-last). :func:`input_item` packs a range of tile rows of
one image channels-last and zero-padded into scratch and transforms them into ``V``
([36, tiles, C]); :func:`position_gemms` runs the GEMMs of a range of positions
(:func:`._nb.sgemm`, single-threaded BLAS on the caller's worker thread) into ``M``
([36, tiles, K]); :func:`output_item` transforms ``M`` back into a channels-last output
block and stores it into the NCHW output. :mod:`._conv_winograd` schedules them.
"""

# The function bodies are numba nopython code: numba types them, and numba's stubs
# cannot describe that to mypy.
# mypy: ignore-errors

from __future__ import annotations

import numpy as np

from ._nb import NO, YES, as_int, jit, sgemm, transpose8, wide_vectors

__all__ = [
    "input_item",
    "input_item_scratch",
    "output_item",
    "output_item_scratch",
    "grad_item",
    "position_gemms",
    "position_filter_gemms",
    "filter_transform",
    "filter_untransform",
    "non_finite",
    "taps_last",
    "warm_up",
]

_F = np.float32
_Q = _F(0.25)
_S6 = _F(1.0 / 6.0)
_S12 = _F(1.0 / 12.0)
_S24 = _F(1.0 / 24.0)
_TWO = _F(2.0)
_HALF = _F(0.5)
_FOUR = _F(4.0)
_FIVE = _F(5.0)
_EIGHT = _F(8.0)
_ZERO = _F(0.0)
_EXP_MASK = np.int32(0x7F800000)  # exponent bits all set: inf or NaN


@jit
def _g_lines(src, s, ss, dst, d, ds, count):
    """``dst[d + a * ds, i] = (G [src[s + j * ss, i] for j < 3])[a]`` for ``i < count``."""
    for i in range(count):
        dst[d, i] = src[s, i] * _Q
    d += ds
    for i in range(count):
        dst[d, i] = -((src[s, i] + src[s + 2 * ss, i]) * _S6 + src[s + ss, i] * _S6)
    d += ds
    for i in range(count):
        dst[d, i] = src[s + ss, i] * _S6 - (src[s, i] + src[s + 2 * ss, i]) * _S6
    d += ds
    for i in range(count):
        dst[d, i] = (src[s, i] * _S24 + src[s + 2 * ss, i] * _S6) + src[s + ss, i] * _S12
    d += ds
    for i in range(count):
        dst[d, i] = (src[s, i] * _S24 + src[s + 2 * ss, i] * _S6) - src[s + ss, i] * _S12
    d += ds
    for i in range(count):
        dst[d, i] = src[s + 2 * ss, i]


@jit
def _gt_lines(src, s, ss, dst, d, ds, count):
    """``dst[d + r * ds, i] = (G^T [src[s + j * ss, i] for j < 6])[r]`` for ``i < count``."""
    for i in range(count):
        a = src[s + ss, i] + src[s + 2 * ss, i]
        b = src[s + 3 * ss, i] + src[s + 4 * ss, i]
        dst[d, i] = src[s, i] * _Q - a * _S6 + b * _S24
    d += ds
    for i in range(count):
        dst[d, i] = (src[s + 2 * ss, i] - src[s + ss, i]) * _S6 + (
            src[s + 3 * ss, i] - src[s + 4 * ss, i]
        ) * _S12
    d += ds
    for i in range(count):
        a = src[s + ss, i] + src[s + 2 * ss, i]
        b = src[s + 3 * ss, i] + src[s + 4 * ss, i]
        dst[d, i] = (b - a) * _S6 + src[s + 5 * ss, i]


@jit
def _g2_lines(src, s, ss, dst, d, ds, count):
    """F(2x2, 3x3)'s ``G``: ``dst[d + a * ds, i] = (G [src[s + j * ss, i] for j < 3])[a]``, ``a < 4``."""
    for i in range(count):
        dst[d, i] = src[s, i]
    d += ds
    for i in range(count):
        dst[d, i] = ((src[s, i] + src[s + 2 * ss, i]) + src[s + ss, i]) * _HALF
    d += ds
    for i in range(count):
        dst[d, i] = ((src[s, i] + src[s + 2 * ss, i]) - src[s + ss, i]) * _HALF
    d += ds
    for i in range(count):
        dst[d, i] = src[s + 2 * ss, i]


@jit
def filter_transform(ft, u, c0, c1, tmp, tile=4):
    """``u[xi, c, k] = (G g G^T)[xi]`` for the filters ``g = ft[c, :, :, k]``, channels ``[c0, c1)``.

    ``tile`` is the output tile size: 4 for F(4x4, 3x3), 2 for F(2x2, 3x3) (its ``G`` is
    :func:`_g2_lines`); ``alpha = tile + 2``. ``ft`` is [Cin, 3, 3, Kout] (C-contiguous),
    ``u`` flat [alpha**2, Cin, Kout], ``tmp`` float32 scratch of 3 alpha Kout.
    Vectorised over the output channels. Returns False when a filter value is not finite.
    """
    wide_vectors()
    alpha = tile + 2
    cin, kout = ft.shape[0], ft.shape[3]
    if non_finite(ft.reshape(-1)[c0 * 9 * kout : c1 * 9 * kout]):
        return False
    taps = ft.reshape((cin * 9, kout))
    rows = tmp[: 3 * alpha * kout].reshape((3 * alpha, kout))
    out = u.reshape((alpha * alpha * cin, kout))
    for c in range(c0, c1):
        for s in range(3):
            # rows[a * 3 + s] = (G g)[a, s]
            if tile == 4:
                _g_lines(taps, c * 9 + s, 3, rows, s, 3, kout)
            else:
                _g2_lines(taps, c * 9 + s, 3, rows, s, 3, kout)
        for a in range(alpha):
            # u[a * alpha + b, c] = ((G g) G^T)[a, b]
            if tile == 4:
                _g_lines(rows, a * 3, 1, out, a * alpha * cin + c, cin, kout)
            else:
                _g2_lines(rows, a * 3, 1, out, a * alpha * cin + c, cin, kout)
    return True


@jit
def filter_untransform(du, out, c0, c1, tmp):
    """``out[c, :, :, k] = G^T du[:, c, k] G`` for channels ``[c0, c1)``.

    ``du`` is flat [36, C, K]; ``out`` is [C, 3, 3, K]; ``tmp`` float32 scratch of 18 K.
    """
    wide_vectors()
    cin, kout = out.shape[0], out.shape[3]
    src = du.reshape((36 * cin, kout))
    rows = tmp[: 18 * kout].reshape((18, kout))
    dst = out.reshape((cin * 9, kout))
    for c in range(c0, c1):
        for b in range(6):
            # rows[r * 6 + b] = (G^T du)[r, b]
            _gt_lines(src, b * cin + c, 6 * cin, rows, b, 6, kout)
        for r in range(3):
            _gt_lines(rows, r * 6, 1, dst, c * 9 + r * 3, 1, kout)


@jit
def taps_last(f, out, flip):
    """Filters ``f`` [K, C, 3, 3] rearranged for the transforms (8 x 8 register transposes).

    Without ``flip``: ``out`` [C, 3, 3, K] (the forward filters, taps then output
    channels). With ``flip``: ``out`` [K, 3, 3, C] holding ``f[k, c, 2 - r, 2 - s]`` (the
    data gradient's filters: K and C swapped, taps reversed).
    """
    kout, cin = f.shape[0], f.shape[1]
    src = f.reshape(-1)
    dst = out.reshape(-1)
    if not flip:
        # A plain transpose of the [K, 9 C] matrix, in bands of 64 columns so that each
        # destination line is completed while it is in cache.
        rows, cols = kout, 9 * cin
        r8, c8 = rows - rows % 8, cols - cols % 8
        for c0 in range(0, c8, 64):
            for r in range(0, r8, 8):
                for c in range(c0, min(c8, c0 + 64), 8):
                    transpose8(src, r * cols + c, cols, dst, c * rows + r, rows)
        for r in range(r8, rows):
            for c in range(cols):
                dst[c * rows + r] = src[r * cols + c]
        for r in range(r8):
            for c in range(c8, cols):
                dst[c * rows + r] = src[r * cols + c]
        return
    # Per output channel k: the [C, 9] block transposed into [9, C], its rows reversed.
    c8 = cin - cin % 8
    for k in range(kout):
        base = k * cin * 9
        for c in range(0, c8, 8):
            # Taps 0..7 of channels c..c+7 -> rows 8..1 (stride -C).
            transpose8(src, base + c * 9, 9, dst, base + 8 * cin + c, -cin)
        for c in range(c8, cin):
            for t in range(8):
                dst[base + (8 - t) * cin + c] = src[base + c * 9 + t]
        for c in range(cin):
            dst[base + c] = src[base + c * 9 + 8]


@jit
def non_finite(row):
    """1 when a value of the float32 row is inf or NaN, else 0 (an or-reduction that vectorises)."""
    bad = 0
    for i in range(row.shape[0]):
        bad |= (as_int(row[i]) & _EXP_MASK) == _EXP_MASK
    return bad


@jit
def _to_channels_last(src, n, h0, w0, rows, cols, out):
    """``out[r * cols + j, c] = src[n, c, h0 + r, w0 + j]`` (0 outside ``src``); 1 if one was not finite.

    ``out`` is 2-D [rows * cols, C]; the interior moves in 8 x 8 register transposes.
    """
    cin, height, width = src.shape[1], src.shape[2], src.shape[3]
    flat = src.reshape(-1)
    dst = out.reshape(-1)
    plane = height * width
    lo = min(cols, max(0, -w0))  # first column inside the image
    hi = max(lo, min(cols, width - w0))  # one past the last
    c8 = cin - cin % 8
    bad = 0
    for r in range(rows):
        h = h0 + r
        if h < 0 or h >= height:
            out[r * cols : (r + 1) * cols, :] = 0
            continue
        out[r * cols : r * cols + lo, :] = 0
        out[r * cols + hi : (r + 1) * cols, :] = 0
        for c in range(cin):
            bad |= non_finite(src[n, c, h, w0 + lo : w0 + hi])
        base = ((n * cin) * height + h) * width + w0
        j = lo
        while j + 8 <= hi:
            for c in range(0, c8, 8):
                transpose8(flat, base + c * plane + j, plane, dst, (r * cols + j) * cin + c, cin)
            j += 8
        for jj in range(j, hi):
            for c in range(c8):
                out[r * cols + jj, c] = src[n, c, h, w0 + jj]
        for c in range(c8, cin):
            for jj in range(lo, hi):
                out[r * cols + jj, c] = src[n, c, h, w0 + jj]
    return bad


@jit
def _bt_lines(src, s, ss, dst, d, ds, count):
    """``dst[d + b * ds, i] = (B^T [src[s + j * ss, i] for j < 6])[b]`` for ``i < count``.

    Rows of 2-D arrays, the loop variable the last index: the addresses stay affine in
    ``i`` (an index computed as ``base + i`` would get numba's negative-index fix-up in
    the loop and become a gather). One output stream per loop: LLVM cannot tell the
    arrays apart, and a loop with a single store and a few load streams is vectorised
    behind a cheap runtime overlap check.
    """
    for i in range(count):
        dst[d, i] = _FOUR * src[s, i] - _FIVE * src[s + 2 * ss, i] + src[s + 4 * ss, i]
    d += ds
    for i in range(count):
        p = src[s + 4 * ss, i] - _FOUR * src[s + 2 * ss, i]
        dst[d, i] = p + (src[s + 3 * ss, i] - _FOUR * src[s + ss, i])
    d += ds
    for i in range(count):
        p = src[s + 4 * ss, i] - _FOUR * src[s + 2 * ss, i]
        dst[d, i] = p - (src[s + 3 * ss, i] - _FOUR * src[s + ss, i])
    d += ds
    for i in range(count):
        r = src[s + 4 * ss, i] - src[s + 2 * ss, i]
        dst[d, i] = r + _TWO * (src[s + 3 * ss, i] - src[s + ss, i])
    d += ds
    for i in range(count):
        r = src[s + 4 * ss, i] - src[s + 2 * ss, i]
        dst[d, i] = r - _TWO * (src[s + 3 * ss, i] - src[s + ss, i])
    d += ds
    for i in range(count):
        dst[d, i] = _FOUR * src[s + ss, i] - _FIVE * src[s + 3 * ss, i] + src[s + 5 * ss, i]


@jit
def _at_lines(src, s, ss, dst, d, ds, count):
    """``dst[d + o * ds, i] = (A^T [src[s + j * ss, i] for j < 6])[o]`` for ``i < count``."""
    for i in range(count):
        dst[d, i] = src[s, i] + src[s + ss, i] + src[s + 2 * ss, i] + src[s + 3 * ss, i] + src[s + 4 * ss, i]
    d += ds
    for i in range(count):
        dst[d, i] = (src[s + ss, i] - src[s + 2 * ss, i]) + _TWO * (src[s + 3 * ss, i] - src[s + 4 * ss, i])
    d += ds
    for i in range(count):
        dst[d, i] = (src[s + ss, i] + src[s + 2 * ss, i]) + _FOUR * (src[s + 3 * ss, i] + src[s + 4 * ss, i])
    d += ds
    for i in range(count):
        dst[d, i] = (
            (src[s + ss, i] - src[s + 2 * ss, i])
            + _EIGHT * (src[s + 3 * ss, i] - src[s + 4 * ss, i])
            + src[s + 5 * ss, i]
        )


@jit
def _a_lines(src, s, ss, dst, d, ds, count):
    """``dst[d + a * ds, i] = (A [src[s + j * ss, i] for j < 4])[a]`` for ``i < count``."""
    for i in range(count):
        dst[d, i] = src[s, i]
    d += ds
    for i in range(count):
        dst[d, i] = (src[s, i] + src[s + 2 * ss, i]) + (src[s + ss, i] + src[s + 3 * ss, i])
    d += ds
    for i in range(count):
        dst[d, i] = (src[s, i] + src[s + 2 * ss, i]) - (src[s + ss, i] + src[s + 3 * ss, i])
    d += ds
    for i in range(count):
        dst[d, i] = (src[s, i] + _FOUR * src[s + 2 * ss, i]) + (
            _TWO * src[s + ss, i] + _EIGHT * src[s + 3 * ss, i]
        )
    d += ds
    for i in range(count):
        dst[d, i] = (src[s, i] + _FOUR * src[s + 2 * ss, i]) - (
            _TWO * src[s + ss, i] + _EIGHT * src[s + 3 * ss, i]
        )
    d += ds
    for i in range(count):
        dst[d, i] = src[s + 3 * ss, i]


@jit
def _input_transform(xp, rows_t, tw_count, cin, tmp, v, t0, tiles):
    """Tiles of ``rows_t`` tile rows packed in ``xp`` ([4 rows_t + 2, (4 TW + 2) C]) into ``v``.

    ``tmp`` is [6 (4 TW + 2), C]; ``v`` is [36 tiles, C] (row ``xi * tiles + t``); the tiles
    go to positions ``t0 ..``.
    """
    width = 4 * tw_count + 2
    strip = tmp.reshape((6, width * cin))
    for lt in range(rows_t):
        # Down the columns: the 6 rows of a strip of patches -> the 6 rows of B^T d.
        _bt_lines(xp, 4 * lt, 1, strip, 0, 1, width * cin)
        # Along the rows of each tile: (B^T d) B.
        for tw in range(tw_count):
            t = t0 + lt * tw_count + tw
            for a in range(6):
                _bt_lines(tmp, a * width + 4 * tw, 1, v, a * 6 * tiles + t, tiles, cin)


@jit
def _output_transform(m, t0, rows_t, tw_count, kout, tiles, tt, yo):
    """Tiles ``t0 ..`` of ``m`` ([36 tiles, K]) into ``yo`` ([4 rows_t 4 TW, K]); ``tt`` is [24, K]."""
    ow_pad = 4 * tw_count
    for lt in range(rows_t):
        for tw in range(tw_count):
            t = t0 + lt * tw_count + tw
            # Down the columns: A^T m, into tt [4, 6, K].
            for b in range(6):
                _at_lines(m, b * tiles + t, 6 * tiles, tt, b, 6, kout)
            # Along the rows: (A^T m) A, into the channels-last output block.
            for i in range(4):
                _at_lines(tt, i * 6, 1, yo, (4 * lt + i) * ow_pad + 4 * tw, 1, kout)


@jit
def _store(yo, ow_pad, kout, y, n, oh0, rows, bias, flags):
    """``y[n, k, oh0 + r, w] = yo[r * ow_pad + w, k] (+ bias[k])`` for the rows inside ``y``.

    ``flags``: 1 adds ``bias``, 2 then applies ReLU (NaN -> 0, as the ``unary`` op), on
    each row while it is in cache.
    """
    height, width = y.shape[2], y.shape[3]
    rows = min(rows, height - oh0)
    src = yo.reshape(-1)
    flat = y.reshape(-1)
    plane = height * width
    k8 = kout - kout % 8
    w8 = width - width % 8
    for r in range(rows):
        base = ((n * kout) * height + oh0 + r) * width
        for w in range(0, w8, 8):
            for k in range(0, k8, 8):
                transpose8(src, (r * ow_pad + w) * kout + k, kout, flat, base + k * plane + w, plane)
        for k in range(k8):
            for w in range(w8, width):
                y[n, k, oh0 + r, w] = yo[r * ow_pad + w, k]
        for k in range(k8, kout):
            for w in range(width):
                y[n, k, oh0 + r, w] = yo[r * ow_pad + w, k]
        if flags & 1:
            for k in range(kout):
                dst = y[n, k, oh0 + r]
                b = bias[k]
                for w in range(width):
                    dst[w] += b
        if flags & 2:
            for k in range(kout):
                dst = y[n, k, oh0 + r]
                for w in range(width):
                    v = dst[w]
                    dst[w] = v if v > _ZERO else _ZERO


@jit
def _grad_transform(gp, rows_t, tw_count, kout, tmp, mg, t0, tiles):
    """``mg[xi, t, k] = (A dY A^T)[xi]`` for the 4x4 gradient tiles packed in ``gp``.

    ``gp`` is [4 rows_t 4 TW, K], ``tmp`` [24, K], ``mg`` [36 tiles, K].
    """
    ow_pad = 4 * tw_count
    for lt in range(rows_t):
        for tw in range(tw_count):
            t = t0 + lt * tw_count + tw
            # Down the columns: A y for each of the 4 columns of the tile, into tmp [6, 4, K].
            for j in range(4):
                _a_lines(gp, 4 * lt * ow_pad + 4 * tw + j, ow_pad, tmp, j, 4, kout)
            # Along the rows: (A y) A^T.
            for a in range(6):
                _a_lines(tmp, a * 4, 1, mg, a * 6 * tiles + t, tiles, kout)


# --------------------------------------------------------------------------- entry points
# Each step of the pipeline is one call over a range of tile rows (or of positions):
# the fused schedule runs the three on one work item in turn, the by-position schedule
# runs each over all tiles before the next.


@jit
def input_item(x, n, th0, th1, pt, pl, tw_count, v, tiles, t0, work):
    """V rows ``t0 ..`` (``v`` flat [36, tiles, C]) for tile rows ``[th0, th1)`` of image ``n``.

    Returns 1 when an input value was not finite, else 0.
    """
    cin = x.shape[1]
    rows_t = th1 - th0
    width = 4 * tw_count + 2
    xp_size = (4 * rows_t + 2) * width * cin
    xp = work[:xp_size]
    tmp = work[xp_size : xp_size + 6 * width * cin].reshape((6 * width, cin))
    bad = _to_channels_last(x, n, 4 * th0 - pt, -pl, 4 * rows_t + 2, width, xp.reshape((-1, cin)))
    _input_transform(
        xp.reshape((4 * rows_t + 2, width * cin)),
        rows_t,
        tw_count,
        cin,
        tmp,
        v.reshape((36 * tiles, cin)),
        t0,
        tiles,
    )
    return bad


def input_item_scratch(rows_t: int, tw_count: int, cin: int) -> int:
    """Float32 elements of scratch one :func:`input_item` call needs."""
    return (4 * rows_t + 8) * (4 * tw_count + 2) * cin


@jit
def position_gemms(u, v, m, xi0, xi1, tiles, cin, kout):
    """``M[xi] (tiles x K) = V[xi] (tiles x C) @ U[xi] (C x K)`` for positions ``[xi0, xi1)``."""
    for xi in range(xi0, xi1):
        sgemm(
            NO,
            NO,
            kout,
            tiles,
            cin,
            1.0,
            u,
            xi * cin * kout,
            kout,
            v,
            xi * tiles * cin,
            cin,
            0.0,
            m,
            xi * tiles * kout,
            kout,
        )


@jit
def output_item(m, y, n, th0, th1, tw_count, tiles, t0, bias, flags, work):
    """Output tile rows ``[th0, th1)`` of image ``n`` from M rows ``t0 ..`` (``m`` flat [36, tiles, K]).

    ``flags``: 1 adds ``bias``, 2 applies ReLU after it (see :func:`_store`).
    """
    kout = y.shape[1]
    rows_t = th1 - th0
    tt = work[: 24 * kout].reshape((24, kout))
    yo = work[24 * kout : 24 * kout + 16 * rows_t * tw_count * kout].reshape((16 * rows_t * tw_count, kout))
    _output_transform(m.reshape((36 * tiles, kout)), t0, rows_t, tw_count, kout, tiles, tt, yo)
    _store(yo, 4 * tw_count, kout, y, n, 4 * th0, 4 * rows_t, bias, flags)


def output_item_scratch(rows_t: int, tw_count: int, kout: int) -> int:
    """Float32 elements of scratch one :func:`output_item` call needs."""
    return (24 + 16 * rows_t * tw_count) * kout


@jit
def grad_item(gy, n, th0, th1, tw_count, mg, tiles, t0, work):
    """``(A dY A^T)`` rows ``t0 ..`` (``mg`` flat [36, tiles, K]) for tile rows ``[th0, th1)``.

    Returns 1 when a gradient value was not finite, else 0.
    """
    kout = gy.shape[1]
    rows_t = th1 - th0
    size = 16 * rows_t * tw_count * kout
    gp = work[:size].reshape((16 * rows_t * tw_count, kout))
    tg = work[size : size + 24 * kout].reshape((24, kout))
    bad = _to_channels_last(gy, n, 4 * th0, 0, 4 * rows_t, 4 * tw_count, gp)
    _grad_transform(gp, rows_t, tw_count, kout, tg, mg.reshape((36 * tiles, kout)), t0, tiles)
    return bad


@jit
def position_filter_gemms(v, mg, du, xi0, xi1, tiles, cin, kout, beta):
    """``dU[xi] (C x K) = V[xi]^T (C x tiles) @ Mg[xi] (tiles x K) + beta dU[xi]`` for ``[xi0, xi1)``."""
    for xi in range(xi0, xi1):
        sgemm(
            NO, YES, kout, cin, tiles, 1.0,
            mg, xi * tiles * kout, kout, v, xi * tiles * cin, cin, beta, du, xi * cin * kout, kout,
        )  # fmt: skip


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel of this module now."""
    x = np.zeros((1, 1, 4, 4), dtype=_F)
    f = np.zeros((1, 3, 3, 1), dtype=_F)
    u = np.zeros(36, dtype=_F)
    y = np.zeros((1, 1, 4, 4), dtype=_F)
    bias = np.zeros(1, dtype=_F)
    tmp = np.zeros(18, dtype=_F)
    filter_transform(f, u, 0, 1, tmp)
    filter_untransform(u, f, 0, 1, tmp)
    work = np.zeros(input_item_scratch(1, 1, 1) + output_item_scratch(1, 1, 1), dtype=_F)
    non_finite(work[:4])
    taps_last(np.zeros((1, 1, 3, 3), dtype=_F), f, False)
    taps_last(np.zeros((1, 1, 3, 3), dtype=_F), f, True)
    v = np.zeros(36, dtype=_F)
    input_item(x, 0, 0, 1, 1, 1, 1, v, 1, 0, work)
    position_gemms(u, v, v, 0, 36, 1, 1, 1)
    output_item(v, y, 0, 0, 1, 1, 1, 0, bias, 3, work)
    grad_item(y, 0, 0, 1, 1, v, 1, 0, work)
    position_filter_gemms(v, v, u, 0, 36, 1, 1, 1, 0.0)

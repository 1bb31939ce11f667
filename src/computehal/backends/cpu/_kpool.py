"""Compiled 2-D pooling kernel of the CPU backend (numba), for float32 and float64.

Planes ([H, W] images of one channel) are pooled one output row at a time: for each
filter row inside the image, each filter column folds one strided input row segment
into the output row, so the inner loop runs along the output row and vectorises. Taps
outside the image are never read: MAX ignores padding (and NaN, like ``fmax``), AVG
divides by the number of taps inside the image, or with ``count_include_pad`` inside
the padded image (ceil-mode overhang never counts).

Up to three filter rows and the stride-2 column folds of up to three taps (ResNet's
3x3 / 2 max pool, DenseNet's 2x2 / 2 average pool) run as explicit 16-lane LLVM vectors
(:mod:`._kpoolv`): LLVM's own vectorisation of the column fold used gathers, and its
row folds left 48 of 112 columns to remainder loops. With the input in L2 (compute
alone, one core) that took a 3x3 / 2 max pool from 1.03 to 0.75 ns an input element
and a 2x2 / 2 average pool from 0.78 to 0.61 (under load from other processes; the
input streamed from memory costs about 0.33 ns an element on one core, whatever the
kernel). ``pool_planes`` asks for 512-bit vectors (:func:`._nb.wide_vectors`).

How the loops are written matters to LLVM: operands are flat arrays indexed with
unsigned offsets (a signed index makes numba test for negative indices, which stops
vectorisation), the common strides 1 and 2 are literals, and no array is sliced or
passed to another function inside the loops (each costs reference counting).
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from ._kpoolv import LANES, fold_rows, fold_stride2, means16_f32, sum_f32
from ._nb import jit, jit_reassoc, prefetch, wide_vectors

__all__ = ["global_planes", "pool_planes", "tap_range", "tap_range_cols", "column_plan", "warm_up"]

_U = np.uint64


def _compiled(**extra: Any) -> Any:
    def decorate(fn: Any) -> Any:
        options: dict[str, Any] = dict(nogil=True, error_model="numpy", **extra)
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:  # no writable cache location
            return numba.njit(cache=False, **options)(fn)

    return decorate


_jit = jit
#: Reductions: reassociation lets LLVM keep a vector of partial results (no NaN assumption).
_reduce = jit_reassoc
#: Helpers called inside the loops: inlined by numba (a call passing arrays costs reference counting).
_inline = _compiled(inline="always")


@_inline
def _index_range(start: int, step: int, count: int, size: int) -> tuple[int, int]:
    """The indices ``[i0, i1)`` of ``range(count)`` whose position ``start + i*step`` is in ``[0, size)``."""
    i0 = 0 if start >= 0 else (-start + step - 1) // step
    last = size - 1 - start
    i1 = 0 if last < 0 else min(count, last // step + 1)
    return i0, max(i0, i1)


@_jit
def tap_range(o: int, stride: int, pad: int, dil: int, taps: int, size: int) -> tuple[int, int]:
    """The taps ``[t0, t1)`` of output ``o`` that land inside ``[0, size)``: ``o*stride - pad + t*dil``."""
    return _index_range(o * stride - pad, dil, taps, size)


@_jit
def tap_range_cols(s: int, sw: int, pl: int, dw: int, ow: int, w: int) -> tuple[int, int]:
    """Output columns ``[j0, j1)`` whose tap ``s`` reads inside ``[0, w)``: ``0 <= j*sw - pl + s*dw < w``."""
    return _index_range(s * dw - pl, sw, ow, w)


@_jit
def column_plan(kw: int, sw: int, pl: int, dw: int, ow: int, w: int) -> Any:
    """Per filter column ``s``: the first output column, their number, and the input column of the first."""
    plan = np.zeros((kw, 3), dtype=np.int64)
    for s in range(kw):
        j0, j1 = tap_range_cols(s, sw, pl, dw, ow, w)
        plan[s, 0] = j0
        plan[s, 1] = j1 - j0
        plan[s, 2] = j0 * sw - pl + s * dw
    return plan


@_inline
def _op(a: Any, b: Any, is_max: bool) -> Any:
    """``b`` folded into ``a``: ``b`` if ``b > a`` else ``a`` (a NaN ``b`` is skipped), or ``a + b``."""
    if is_max:
        return b if b > a else a
    return a + b


#: Output rows ahead whose input rows are prefetched (the hardware prefetcher alone
#: leaves the row folds waiting on memory).
PREFETCH_ROWS = 6
#: How far ahead global pooling prefetches its rows.
PREFETCH_BYTES = 1 << 14


@_inline
def _fold_rows(
    xf: Any, first: int, count: int, step: int, row: Any, at: int, w: int, low: Any, is_max: bool
) -> None:
    """``row[at : at + w]`` = fmax / sum of ``count`` input rows ``first``, ``first + step``, ...

    Up to three rows in one pass (whole vectors through :func:`._kpoolv.fold_rows`),
    more as the first two rows in one pass and then one pass per row.
    A max starts from ``low`` (-inf in the arrays' type) and keeps the larger operand, so
    a NaN never becomes the running value (``fmax``); a sum starts from the first row,
    so NaN propagates.
    """
    # Up to 3 rows as explicit vectors (no alias checks, no loop remainders); the last
    # vector ends at the row's end (a few columns computed twice, to the same values).
    body = w if count <= 3 and w >= LANES else 0
    for q0 in range(0, body, LANES):
        q = min(q0, w - LANES)
        if is_max and count == 3:
            fold_rows(xf, first + q, step, row, at + q, low, 3, True)
        elif is_max and count == 2:
            fold_rows(xf, first + q, step, row, at + q, low, 2, True)
        elif is_max:
            fold_rows(xf, first + q, step, row, at + q, low, 1, True)
        elif count == 3:
            fold_rows(xf, first + q, step, row, at + q, low, 3, False)
        elif count == 2:
            fold_rows(xf, first + q, step, row, at + q, low, 2, False)
        else:
            fold_rows(xf, first + q, step, row, at + q, low, 1, False)
    dst = _U(at)
    src = _U(first)
    nxt = _U(first + step)
    begin = min(count, 3)
    third = _U(first + 2 * step)
    if is_max and count >= 3:
        for q in range(body, w):
            v, u, t = xf[src + _U(q)], xf[nxt + _U(q)], xf[third + _U(q)]
            m = v if v > low else low
            m = u if u > m else m
            row[dst + _U(q)] = t if t > m else m
    elif count >= 3:
        for q in range(body, w):
            row[dst + _U(q)] = xf[src + _U(q)] + xf[nxt + _U(q)] + xf[third + _U(q)]
    elif is_max and count >= 2:
        for q in range(body, w):
            v, u = xf[src + _U(q)], xf[nxt + _U(q)]
            m = v if v > low else low
            row[dst + _U(q)] = u if u > m else m
    elif is_max:
        for q in range(body, w):
            v = xf[src + _U(q)]
            row[dst + _U(q)] = v if v > low else low
    elif count >= 2:
        for q in range(body, w):
            row[dst + _U(q)] = xf[src + _U(q)] + xf[nxt + _U(q)]
    else:
        for q in range(body, w):
            row[dst + _U(q)] = xf[src + _U(q)]
    for r in range(begin, count):
        src = _U(first + r * step)
        if is_max:
            for q in range(w):
                v, a = xf[src + _U(q)], row[dst + _U(q)]
                row[dst + _U(q)] = v if v > a else a
        else:
            for q in range(w):
                row[dst + _U(q)] += xf[src + _U(q)]


@_inline
def _hloop(
    row: Any, sw: int, dw: int, count: int, of: Any, d: int, n: int, cc: Any, scale: Any, is_max: bool
) -> None:
    """``of[d + j]`` = fmax / mean over ``s < count`` (1 to 3) of ``row[j * sw + s * dw]``, ``j < n``.

    Called with literal ``sw`` and ``count``: LLVM then loads the strided taps as whole
    vectors and shuffles them. ``row`` never holds a NaN for a max; a mean divides by
    ``cc[j] * scale``.
    """
    ud = _U(d)
    if is_max:
        for j in range(n):
            base = _U(j * sw)
            m = row[base]
            if count > 1:
                m = _op(m, row[base + _U(dw)], True)
            if count > 2:
                m = _op(m, row[base + _U(2 * dw)], True)
            of[ud + _U(j)] = m
    else:
        for j in range(n):
            base = _U(j * sw)
            m = row[base]
            if count > 1:
                m += row[base + _U(dw)]
            if count > 2:
                m += row[base + _U(2 * dw)]
            of[ud + _U(j)] = m / (cc[j] * scale)


@_inline
def _fold_columns(
    row: Any, sw: int, dw: int, kw: int, of: Any, d: int, n: int, cc: Any, scale: Any, is_max: bool
) -> None:
    """``of[d + j]`` = fmax / mean over the filter columns ``s`` of ``row[j * sw + s * dw]``, ``j < n``.

    ``row`` is padded with the fold's identity, so every window reads inside it.
    """
    if kw <= 3 and sw <= 2:
        if sw == 1:
            if kw == 1:
                _hloop(row, 1, dw, 1, of, d, n, cc, scale, is_max)
            elif kw == 2:
                _hloop(row, 1, dw, 2, of, d, n, cc, scale, is_max)
            else:
                _hloop(row, 1, dw, 3, of, d, n, cc, scale, is_max)
        elif dw == 1 and n >= LANES:
            # Whole vectors of outputs as explicit vectors (LLVM's vectorisation gathers);
            # the last one ends at the row's end, recomputing a few outputs to the same values.
            last = n - LANES
            for j0 in range(0, n, LANES):
                j = min(j0, last)
                if is_max and kw == 1:
                    fold_stride2(row, 2 * j, of, d + j, cc, j, scale, 1, True)
                elif is_max and kw == 2:
                    fold_stride2(row, 2 * j, of, d + j, cc, j, scale, 2, True)
                elif is_max:
                    fold_stride2(row, 2 * j, of, d + j, cc, j, scale, 3, True)
                elif kw == 1:
                    fold_stride2(row, 2 * j, of, d + j, cc, j, scale, 1, False)
                elif kw == 2:
                    fold_stride2(row, 2 * j, of, d + j, cc, j, scale, 2, False)
                else:
                    fold_stride2(row, 2 * j, of, d + j, cc, j, scale, 3, False)
        elif kw == 1:
            _hloop(row, 2, dw, 1, of, d, n, cc, scale, is_max)
        elif kw == 2:
            _hloop(row, 2, dw, 2, of, d, n, cc, scale, is_max)
        else:
            _hloop(row, 2, dw, 3, of, d, n, cc, scale, is_max)
        return
    ud = _U(d)
    for j in range(n):
        start = _U(j * sw)
        value = row[start]
        for s in range(1, kw):
            v = row[start + _U(s * dw)]
            if is_max:
                value = v if v > value else value
            else:
                value += v
        of[ud + _U(j)] = value if is_max else value / (cc[j] * scale)


@_jit
def pool_planes(x: Any, out: Any, geometry: Any, is_max: bool, include_pad: bool) -> None:
    """Pool C-contiguous planes ``x`` [P, H, W] into ``out`` [P, Oh, Ow].

    ``geometry`` holds (kh, kw, sh, sw, pt, pl, pb, pr, dh, dw) as int64. Separable:
    each output row's input rows are folded into one row, placed in a row padded with
    the fold's identity (-inf, or 0), whose columns are then folded straight into the
    output row.
    """
    wide_vectors()
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw = geometry
    planes, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    xf, of = x.reshape(-1), out.reshape(-1)
    span = max(pl + w, (ow - 1) * sw + (kw - 1) * dw + 1)
    identity = -np.inf if is_max else 0.0
    row = np.full(span + 2 * LANES + 2, identity, dtype=out.dtype)  # (the vector fold reads past the span)
    inner = row[pl : pl + w]
    low = np.full(1, -np.inf, dtype=out.dtype)[0]  # -inf in the dtype (a float64 would widen the max)
    # AVG divides by (rows counted) * (columns counted): small integers, exact in the dtype.
    col_count = np.empty(ow, dtype=out.dtype)
    for j in range(ow):
        a0, a1 = tap_range(j, sw, 0 if include_pad else pl, dw, kw, w + pl + pr if include_pad else w)
        col_count[j] = a1 - a0
    row_count = np.empty(oh, dtype=out.dtype)
    for i in range(oh):
        a0, a1 = tap_range(i, sh, 0 if include_pad else pt, dh, kh, h + pt + pb if include_pad else h)
        row_count[i] = a1 - a0
    for p in range(planes):
        for i in range(oh):
            r0, r1 = tap_range(i, sh, pt, dh, kh, h)
            ahead = (p * h + (i + PREFETCH_ROWS) * sh - pt) * w  # (never faults, even past the end)
            for q in range(0, sh * w, 16):
                prefetch(xf, ahead + q)
            if r1 > r0:
                first = (p * h + i * sh - pt + r0 * dh) * w
                _fold_rows(xf, first, r1 - r0, dh * w, row, pl, w, low, is_max)
            else:
                inner[:] = identity
            _fold_columns(row, sw, dw, kw, of, (p * oh + i) * ow, ow, col_count, row_count[i], is_max)


@_reduce
def global_planes(x: Any, out: Any, is_max: bool) -> None:
    """Global pooling: ``out[p]`` = fmax (NaN skipped, -inf when none) or mean of row ``p`` of 2-D ``x``.

    Means are summed in float64. The rows a few ahead are prefetched (short rows give
    the hardware prefetcher little to go on).
    """
    rows, cols = x.shape
    xf = x.reshape(-1)
    low = np.full(1, -np.inf, dtype=out.dtype)[0]  # -inf in the dtype (a float64 would widen the max)
    ahead = 0
    for r in range(rows):
        while ahead < r * cols + PREFETCH_BYTES // xf.itemsize:
            prefetch(xf, ahead)
            ahead += 64 // xf.itemsize
        base = _U(r * cols)
        if is_max:
            best = low
            for q in range(cols):
                v = xf[base + _U(q)]
                best = v if v > best else best
            out[r] = best
        else:
            total = 0.0
            for q in range(cols):
                total += xf[base + _U(q)]
            out[r] = total / cols


@_jit
def global_means_f32(x: Any, out: Any) -> None:
    """Global average pooling of float32 rows: ``out[p]`` = mean of row ``p`` of 2-D ``x``.

    Each row is summed in 16 float32 partial sums (:func:`._kpoolv.sum_f32`, whole vectors
    and one masked load), which the float64 scalar loop of :func:`global_planes` could not
    be: LLVM vectorises that loop four vectors at a time, and a 7x7 image's 49 values never
    fill them, so every value went through the scalar remainder (about 12 ns a row on this
    Xeon, compute-bound at 16 GB/s of input on one core). The error stays within ``(cols / 16
    + 4)`` float32 roundoffs of the sum of magnitudes, inside the contract's tolerance.
    """
    rows, cols = x.shape
    xf = x.reshape(-1)
    ahead = 0
    for r in range(0, rows - LANES + 1, LANES):
        while ahead < (r + LANES) * cols + PREFETCH_BYTES // 4:
            prefetch(xf, ahead)
            ahead += 16
        means16_f32(xf, r * cols, cols, out, r)
    for r in range(rows - rows % LANES, rows):
        out[r] = sum_f32(xf, r * cols, cols) / np.float32(cols)


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel for float32 and float64."""
    geometry = np.array([2, 2, 1, 1, 0, 0, 0, 0, 1, 1], dtype=np.int64)
    for dtype in (np.float32, np.float64):
        x = np.ones((1, 2, 2), dtype=dtype)
        out = np.empty((1, 1, 1), dtype=dtype)
        for is_max in (False, True):
            for include in (False, True):
                pool_planes(x, out, geometry, is_max, include)
            global_planes(x.reshape(1, 4), out.reshape(1), is_max)
    global_means_f32(np.ones((2, 21), dtype=np.float32), np.empty(2, dtype=np.float32))

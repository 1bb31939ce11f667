"""Compiled 2-D pooling kernel of the CPU backend (numba), for float32 and float64.

Planes ([H, W] images of one channel) are pooled one output row at a time: for each
filter row inside the image, each filter column folds one strided input row segment
into the output row, so the inner loop runs along the output row and vectorises. Taps
outside the image are never read: MAX ignores padding (and NaN, like ``fmax``), AVG
divides by the number of taps inside the image, or with ``count_include_pad`` inside
the padded image (ceil-mode overhang never counts).

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

from ._nb import jit, jit_reassoc

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
def _fold_rows(xf: Any, first: int, count: int, step: int, tmp: Any, is_max: bool) -> None:
    """``tmp`` = fmax / sum of ``count`` input rows ``first``, ``first + step``, ... (flat offsets)."""
    w = tmp.shape[0]
    src = _U(first)
    start = 0
    if not is_max:  # (a max starts from -inf: a NaN must never become the running value)
        for q in range(w):
            tmp[q] = xf[src + _U(q)]
        start = 1
    else:
        for q in range(w):
            tmp[q] = -np.inf
    for r in range(start, count):
        src = _U(first + r * step)
        if is_max:
            for q in range(w):
                v, a = xf[src + _U(q)], tmp[q]
                tmp[q] = v if v > a else a
        else:
            for q in range(w):
                tmp[q] += xf[src + _U(q)]


@_inline
def _fold_columns(tmp: Any, acc: Any, plan: Any, sw: int, is_max: bool) -> None:
    """Fold the row ``tmp`` into ``acc`` through every filter column of ``plan``."""
    for s in range(plan.shape[0]):
        n = plan[s, 1]
        j0 = _U(plan[s, 0])
        src = _U(plan[s, 2])
        if is_max:
            if sw == 1:
                for q in range(n):
                    v, a = tmp[src + _U(q)], acc[j0 + _U(q)]
                    acc[j0 + _U(q)] = v if v > a else a
            elif sw == 2:
                for q in range(n):
                    v, a = tmp[src + _U(2 * q)], acc[j0 + _U(q)]
                    acc[j0 + _U(q)] = v if v > a else a
            else:
                for q in range(n):
                    v, a = tmp[src + _U(q * sw)], acc[j0 + _U(q)]
                    acc[j0 + _U(q)] = v if v > a else a
        elif sw == 1:
            for q in range(n):
                acc[j0 + _U(q)] += tmp[src + _U(q)]
        elif sw == 2:
            for q in range(n):
                acc[j0 + _U(q)] += tmp[src + _U(2 * q)]
        else:
            for q in range(n):
                acc[j0 + _U(q)] += tmp[src + _U(q * sw)]


@_inline
def _fold_windows(
    tmp: Any, acc: Any, col_t0: Any, col_t1: Any, sw: int, pl: int, dw: int, is_max: bool
) -> None:
    """Fold the row ``tmp`` into ``acc`` window by window (few outputs, wide windows)."""
    for j in range(acc.shape[0]):
        t0, t1 = col_t0[j], col_t1[j]
        src = _U(j * sw - pl + t0 * dw)
        value = acc[j]
        if is_max:
            for t in range(t1 - t0):
                v = tmp[src + _U(t * dw)]
                value = v if v > value else value
        else:
            for t in range(t1 - t0):
                value += tmp[src + _U(t * dw)]
        acc[j] = value


@_jit
def pool_planes(x: Any, out: Any, geometry: Any, is_max: bool, include_pad: bool) -> None:
    """Pool C-contiguous planes ``x`` [P, H, W] into ``out`` [P, Oh, Ow].

    ``geometry`` holds (kh, kw, sh, sw, pt, pl, pb, pr, dh, dw) as int64. Separable:
    the window's input rows are folded into one row first, then its columns.
    """
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw = geometry
    planes, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    xf, of = x.reshape(-1), out.reshape(-1)
    plan = column_plan(kw, sw, pl, dw, ow, w)
    col_t0 = np.empty(ow, dtype=np.int64)
    col_t1 = np.empty(ow, dtype=np.int64)
    col_count = np.empty(ow, dtype=np.float64)
    for j in range(ow):
        col_t0[j], col_t1[j] = tap_range(j, sw, pl, dw, kw, w)
        a0, a1 = tap_range(j, sw, 0, dw, kw, w + pl + pr) if include_pad else (col_t0[j], col_t1[j])
        col_count[j] = a1 - a0
    by_window = ow < kw
    tmp = np.empty(w, dtype=out.dtype)
    acc = np.empty(ow, dtype=out.dtype)
    fill = -np.inf if is_max else 0.0
    for p in range(planes):
        for i in range(oh):
            r0, r1 = tap_range(i, sh, pt, dh, kh, h)
            for j in range(ow):
                acc[j] = fill
            if r1 > r0:
                _fold_rows(xf, (p * h + i * sh - pt + r0 * dh) * w, r1 - r0, dh * w, tmp, is_max)
                if by_window:
                    _fold_windows(tmp, acc, col_t0, col_t1, sw, pl, dw, is_max)
                else:
                    _fold_columns(tmp, acc, plan, sw, is_max)
            base = _U((p * oh + i) * ow)
            if is_max:
                for j in range(ow):
                    of[base + _U(j)] = acc[j]
            else:
                a0, a1 = tap_range(i, sh, 0, dh, kh, h + pt + pb) if include_pad else (r0, r1)
                rows = np.float64(a1 - a0)
                for j in range(ow):
                    of[base + _U(j)] = acc[j] / (rows * col_count[j])


@_reduce
def global_planes(x: Any, out: Any, is_max: bool) -> None:
    """Global pooling: ``out[p]`` = fmax (NaN skipped, -inf when none) or mean of row ``p`` of 2-D ``x``."""
    rows, cols = x.shape
    xf = x.reshape(-1)
    for r in range(rows):
        base = _U(r * cols)
        if is_max:
            best = -np.inf
            for q in range(cols):
                v = xf[base + _U(q)]
                best = v if v > best else best
            out[r] = best
        else:
            total = 0.0
            for q in range(cols):
                total += xf[base + _U(q)]
            out[r] = total / cols


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

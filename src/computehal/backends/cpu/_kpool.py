"""Compiled 2-D pooling kernel of the CPU backend (numba), for float32 and float64.

Planes ([H, W] images of one channel) are pooled one output row at a time: for each
filter row inside the image, each filter column adds (or folds the maximum of) one
strided input row segment into the output row, so the inner loop runs along the
output row and vectorises. Taps outside the image are never read: MAX ignores padding
(and NaN, like ``fmax``), AVG divides by the number of taps inside the image, or with
``count_include_pad`` inside the padded image (ceil-mode overhang never counts).
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numba
import numpy as np

__all__ = ["pool_planes", "tap_range", "warm_up"]


def _jit(fn: Any) -> Any:
    options: dict[str, Any] = dict(nogil=True, error_model="numpy")
    try:
        return numba.njit(cache=True, **options)(fn)
    except RuntimeError:  # no writable cache location
        return numba.njit(cache=False, **options)(fn)


@_jit
def tap_range(o: int, stride: int, pad: int, dil: int, taps: int, size: int) -> tuple[int, int]:
    """The taps ``[t0, t1)`` of output ``o`` that land inside ``[0, size)``: ``o*stride - pad + t*dil``."""
    start = o * stride - pad
    t0 = 0 if start >= 0 else (-start + dil - 1) // dil
    last = size - 1 - start
    t1 = 0 if last < 0 else min(taps, last // dil + 1)
    return t0, max(t0, t1)


@_jit
def pool_planes(x: Any, out: Any, geometry: Any, is_max: bool, include_pad: bool) -> None:
    """Pool planes ``x`` [P, H, W] into ``out`` [P, Oh, Ow].

    ``geometry`` holds (kh, kw, sh, sw, pt, pl, pb, pr, dh, dw) as int64.
    """
    kh, kw, sh, sw, pt, pl, pb, pr, dh, dw = geometry
    planes, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    col_t0 = np.empty(ow, dtype=np.int64)
    col_t1 = np.empty(ow, dtype=np.int64)
    col_count = np.empty(ow, dtype=np.float64)
    for j in range(ow):
        t0, t1 = tap_range(j, sw, pl, dw, kw, w)
        col_t0[j] = t0
        col_t1[j] = t1
        if include_pad:
            a0, a1 = tap_range(j, sw, 0, dw, kw, w + pl + pr)
            col_count[j] = a1 - a0
        else:
            col_count[j] = t1 - t0
    acc = np.empty(ow, dtype=out.dtype)
    for p in range(planes):
        image = x[p]
        for i in range(oh):
            r0, r1 = tap_range(i, sh, pt, dh, kh, h)
            fill = -np.inf if is_max else 0.0
            for j in range(ow):
                acc[j] = fill
            for r in range(r0, r1):
                row = image[i * sh - pt + r * dh]
                if ow >= kw:
                    _fold_taps_outer(row, acc, kw, sw, pl, dw, w, is_max)
                else:
                    _fold_taps_inner(row, acc, col_t0, col_t1, sw, pl, dw, is_max)
            dst = out[p, i]
            if is_max:
                for j in range(ow):
                    dst[j] = acc[j]
            else:
                if include_pad:
                    a0, a1 = tap_range(i, sh, 0, dh, kh, h + pt + pb)
                    rows = a1 - a0
                else:
                    rows = r1 - r0
                for j in range(ow):
                    dst[j] = acc[j] / (rows * col_count[j])


@_jit
def _fold_taps_outer(row: Any, acc: Any, kw: int, sw: int, pl: int, dw: int, w: int, is_max: bool) -> None:
    """Fold one input row into the output row: taps outside, output columns inside (long rows)."""
    ow = acc.shape[0]
    for s in range(kw):
        # Output columns whose tap s lands inside the row: j in [j0, j1).
        j0, j1 = tap_range_cols(s, sw, pl, dw, ow, w)
        base = s * dw - pl
        if is_max:
            for j in range(j0, j1):
                acc[j] = np.fmax(acc[j], row[j * sw + base])
        else:
            for j in range(j0, j1):
                acc[j] += row[j * sw + base]


@_jit
def _fold_taps_inner(
    row: Any, acc: Any, col_t0: Any, col_t1: Any, sw: int, pl: int, dw: int, is_max: bool
) -> None:
    """Fold one input row into the output row: output columns outside, taps inside (wide windows)."""
    for j in range(acc.shape[0]):
        base = j * sw - pl
        value = acc[j]
        if is_max:
            for s in range(col_t0[j], col_t1[j]):
                value = np.fmax(value, row[base + s * dw])
        else:
            for s in range(col_t0[j], col_t1[j]):
                value += row[base + s * dw]
        acc[j] = value


@_jit
def tap_range_cols(s: int, sw: int, pl: int, dw: int, ow: int, w: int) -> tuple[int, int]:
    """Output columns ``[j0, j1)`` whose tap ``s`` reads inside ``[0, w)``: ``0 <= j*sw - pl + s*dw < w``."""
    offset = s * dw - pl
    j0 = 0 if offset >= 0 else (-offset + sw - 1) // sw
    last = w - 1 - offset
    j1 = 0 if last < 0 else min(ow, last // sw + 1)
    return j0, max(j0, j1)


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel for float32 and float64."""
    geometry = np.array([2, 2, 1, 1, 0, 0, 0, 0, 1, 1], dtype=np.int64)
    for dtype in (np.float32, np.float64):
        x = np.ones((1, 2, 2), dtype=dtype)
        out = np.empty((1, 1, 1), dtype=dtype)
        for is_max in (False, True):
            for include in (False, True):
                pool_planes(x, out, geometry, is_max, include)

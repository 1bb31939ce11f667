"""Compiled im2col blocks for the CPU backend's GEMM convolutions (numba, float32 and float64).

:func:`im2col_block` writes the filter-window columns of a range of output pixels of
one image: row ``(c * Fh + r) * Fw + s`` holds, for each output pixel of the range, the
input value filter tap (r, s) of channel c reads there (0 where it falls in the
padding), gathered through a table of offsets (:func:`tap_offsets`) shared by every
channel and image of the block. A block of a few hundred columns stays in cache between its construction
and the GEMM that consumes it, so an im2col convolution never writes the whole
``C Fh Fw x Oh Ow`` matrix to memory.
"""

# The function bodies are numba nopython code: numba types them, and numba's stubs
# cannot describe that to mypy.
# mypy: ignore-errors

from __future__ import annotations

import numpy as np

from ._nb import jit

__all__ = ["im2col_block", "im2col_rows", "tap_offsets", "warm_up"]

_U = np.uint64


@jit
def tap_offsets(p0, p1, ow, geometry, height, width, table):
    """``table[r * Fw + s, j]``: offset in an input plane read by tap (r, s) at pixel ``p0 + j``.

    -1 where the tap falls in the padding. ``geometry`` holds (fh, fw, sh, sw, pt, pl,
    dh, dw) as int64; pixel ``p`` is output (p // ow, p % ow).
    """
    fh, fw, sh, sw, pt, pl, dh, dw = geometry
    for j in range(p1 - p0):
        oh = (p0 + j) // ow
        oc = (p0 + j) - oh * ow
        for r in range(fh):
            h = oh * sh - pt + r * dh
            for s in range(fw):
                w = oc * sw - pl + s * dw
                inside = 0 <= h < height and 0 <= w < width
                table[r * fw + s, j] = h * width + w if inside else -1


@jit
def im2col_block(x, n, table, cols, col0):
    """``cols[(c * Fh + r) * Fw + s, col0 + j] = x[n, c].flat[table[r * Fw + s, j]]`` (0 where -1).

    ``x`` is [N, C, H, W], ``table`` from :func:`tap_offsets`, ``cols`` [C Fh Fw, width].
    One gather per column and channel, whatever the stride, dilation or image size (a
    loop over row segments would pay its bookkeeping per segment, which dominates on
    small images).
    """
    cin = x.shape[1]
    taps, count = table.shape[0], table.shape[1]
    for c in range(cin):
        plane = x[n, c].reshape(-1)
        for t in range(taps):
            offsets = table[t]
            dst = cols[c * taps + t, col0 : col0 + count]
            for j in range(count):
                o = offsets[j]
                v = plane[max(o, 0)]
                dst[j] = v if o >= 0 else 0


@jit
def im2col_rows(x, n, p0, p1, ow, geometry, cols, col0):
    """:func:`im2col_block` for wide images: columns ``col0 ..`` for pixels ``[p0, p1)`` of image ``n``.

    Copies strided input row segments (one per output row, tap and channel) without a
    table; ``geometry`` as in :func:`tap_offsets`.
    """
    fh, fw, sh, sw, pt, pl, dh, dw = geometry
    cin, height, width = x.shape[1], x.shape[2], x.shape[3]
    plane = height * width
    src = x.reshape(-1)
    base = n * cin * plane
    for c in range(cin):
        for r in range(fh):
            for s in range(fw):
                dst = cols[(c * fh + r) * fw + s]
                p = p0
                j = col0
                while p < p1:
                    oh = p // ow
                    ow0 = p - oh * ow
                    seg = min(ow - ow0, p1 - p)
                    h = oh * sh - pt + r * dh
                    first = ow0 * sw - pl + s * dw
                    # q0: first q with first + q * sw >= 0; q1: one past the last with < width.
                    q0 = 0 if first >= 0 else min(seg, (-first + sw - 1) // sw)
                    q1 = 0 if first >= width else min(seg, (width - 1 - first) // sw + 1)
                    if h < 0 or h >= height:
                        q1 = q0 = seg
                    q1 = max(q0, q1)
                    # Unsigned indices: numba adds no negative-index fix-up, so the
                    # addresses stay affine in q and the loops vectorise.
                    for q in range(q0):
                        dst[_U(j + q)] = 0
                    row = base + c * plane + h * width + first
                    for q in range(q0, q1):
                        dst[_U(j + q)] = src[_U(row + q * sw)]
                    for q in range(q1, seg):
                        dst[_U(j + q)] = 0
                    p += seg
                    j += seg


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel for float32 and float64 now."""
    geometry = np.array([3, 3, 2, 2, 1, 1, 1, 1], dtype=np.int64)
    table = np.zeros((9, 4), dtype=np.int64)
    tap_offsets(0, 4, 2, geometry, 4, 4, table)
    for dtype in (np.float32, np.float64):
        x = np.zeros((1, 1, 4, 4), dtype=dtype)
        cols = np.zeros((9, 4), dtype=dtype)
        im2col_block(x, 0, table, cols, 0)
        im2col_rows(x, 0, 0, 4, 2, geometry, cols, 0)

"""Compiled bands of the direct convolution (numba): the input's phase split, then the table products.

:func:`split_phases` copies a band of an image's rows into the layout that
:mod:`._conv_direct` multiplies through its tap table: phase (a, b) of a stride
(sh, sw) holds padded pixel (a + u sh, b + v sw) at (u, v), zero outside the image, so
that every tap of a run of output pixels is a unit-stride segment. One pass writes
every element once (the NumPy split this replaces zeroed the borders, then copied each
phase with a strided assignment, and ran on the whole image before any task could
start). :func:`direct_band` splits a band and multiplies it block by block
(:func:`._kgemm.product_table`), applying ReLU to each block while it is in cache, in
one compiled call per band (a Python call per block of rows had cost about 3 % of the
stem's time). It compiles :mod:`._kgemm`'s and :mod:`._kepilogue`'s kernels into itself,
and numba's on-disk cache does not notice when those change: clear the cache
(``__pycache__``) after editing them.
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

import numpy as np

from ._kepilogue import relu_region
from ._kgemm import product_table
from ._nb import jit

_U = np.uint64

__all__ = ["direct_band", "split_phases", "warm_up"]


@jit
def _split_pairs(pairs, base, c, h, half, sh, pt, pl, r0, hq, wq, out):
    """:func:`split_phases` at column stride 2 on even rows, reading each row as 64-bit pixel pairs.

    ``pairs``: the input as uint64 (pixel pairs), image from ``pairs[base]``, rows of
    ``half`` pairs; ``out``: the layout as uint32. Pair ``m`` holds columns 2m (phase
    ``pl % 2``, at ``v = m + pl // 2``) and 2m + 1 (the other phase, at ``m + (pl + 1) // 2``):
    one load, a truncation and a shift per two pixels, where a loop per phase compiled
    to gathers.
    """
    for ci in range(c):
        for a in range(sh):
            for u in range(hq):
                row = (r0 + u) * sh + a - pt
                first = (ci * sh + a) * 2 * hq * wq + u * wq
                for j in range(2):  # j = 0: even columns, 1: odd ones
                    b = (pl + j) % 2
                    shift = (pl + j) // 2
                    o = first + b * hq * wq
                    m1 = max(0, min(half, wq - shift)) if 0 <= row < h else 0
                    start = min(wq, shift) if m1 > 0 else wq
                    for v in range(start):
                        out[_U(o) + _U(v)] = np.uint32(0)
                    for v in range(start + m1, wq):
                        out[_U(o) + _U(v)] = np.uint32(0)
                    if m1 == 0:
                        continue
                    src = _U(base + (ci * h + row) * half)
                    dst = _U(o + shift)
                    bits = np.uint64(32 * j)
                    for m in range(m1):
                        out[dst + _U(m)] = np.uint32((pairs[src + _U(m)] >> bits) & np.uint64(0xFFFFFFFF))


@jit
def split_phases(x, base, c, h, w, sh, sw, pt, pl, r0, hq, wq, out):
    """``out[((ci sh + a) sw + b) hq wq + u wq + v]`` = pixel (row, col) of channel ``ci``, or 0 outside.

    ``x``: a flat float32 image [C, H, W] from ``x[base]``; row ``(r0 + u) sh + a - pt``,
    column ``v sw + b - pl``, for ``u < hq``, ``v < wq``: output rows ``r0 ..`` of a
    convolution with stride (sh, sw) and top / left padding (pt, pl).
    """
    if sw == 2 and w % 2 == 0 and base % 2 == 0:
        _split_pairs(x.view(np.uint64), base // 2, c, h, w // 2, sh, pt, pl, r0, hq, wq, out.view(np.uint32))
        return
    zero = np.float32(0.0)
    for ci in range(c):
        for a in range(sh):
            for b in range(sw):
                plane = ((ci * sh + a) * sw + b) * hq * wq
                v0 = min(wq, max(0, (pl - b + sw - 1) // sw))
                v1 = max(v0, min(wq, (w + pl - b + sw - 1) // sw))
                for u in range(hq):
                    o = plane + u * wq
                    row = (r0 + u) * sh + a - pt
                    if row < 0 or row >= h:
                        for v in range(wq):
                            out[o + v] = zero
                        continue
                    for v in range(v0):
                        out[o + v] = zero
                    # Unsigned offsets: no negative-index wraparound, so LLVM vectorises the copy.
                    src = _U(base + (ci * h + row) * w + b - pl + v0 * sw)
                    dst = _U(o + v0)
                    if sw == 2:
                        for v in range(v1 - v0):
                            out[dst + _U(v)] = x[src + _U(2 * v)]
                    else:
                        for v in range(v1 - v0):
                            out[dst + _U(v)] = x[src + _U(v * sw)]
                    for v in range(v1, wq):
                        out[o + v] = zero


@jit
def direct_band(x, base, image, phases, geometry, band, filt, offsets, planes, relu):
    """Output rows ``band = (i, r0, r1, rows)`` of image ``i``, by blocks of ``rows`` rows.

    ``image``: (C, H, W) of the flat float32 input ``x``, image ``i`` at ``x[base]``;
    ``geometry``: (sh, sw, pt, pl, hq, wq) of the phase layout (:func:`split_phases`, into
    ``phases``) and the output's width Ow; ``filt``: (packed, pbias, depth) from :func:`._kgemm.pack_filter`;
    ``offsets``: the taps' offsets in the layout; ``planes``: the output [N, K, Oh Ow],
    C-contiguous; ``relu``: apply ReLU (NaN -> 0) to each block after its product.
    """
    c, h, w = image
    sh, sw, pt, pl, hq, wq, ow = geometry
    i, r0, r1, rows = band
    packed, pbias, depth = filt
    k, plane = planes.shape[1], planes.shape[2]
    split_phases(x, base, c, h, w, sh, sw, pt, pl, r0, hq, wq, phases)
    flat = planes.reshape(-1)
    for b0 in range(r0, r1, rows):
        b1 = min(r1, b0 + rows)
        width = (b1 - b0 - 1) * wq + ow
        out = flat[(i * k * plane) + b0 * ow :]
        product_table(packed, pbias, k, depth, phases, (b0 - r0) * wq, offsets, out, plane, width, wq, ow)
        if relu:
            relu_region(planes, i, i + 1, 0, k, b0 * ow, b1 * ow)


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel, and check it on a small case."""
    x = np.arange(1.0, 31.0, dtype=np.float32)  # one channel, 5 x 6
    out = np.full(2 * 2 * 3 * 4, -1.0, dtype=np.float32)
    split_phases(x, 0, 1, 5, 6, 2, 2, 1, 1, 0, 3, 4, out)
    padded = np.pad(x.reshape(5, 6), 1)
    want = np.zeros((2, 2, 3, 4), dtype=np.float32)
    for a in range(2):
        for b in range(2):
            part = padded[a::2, b::2][:3, :4]
            want[a, b, : part.shape[0], : part.shape[1]] = part
    if not np.array_equal(out.reshape(2, 2, 3, 4), want):
        raise RuntimeError("the compiled phase split gives wrong results here")
    # A 1 x 1 filter of weight 1, stride 2, no padding, ReLU: every other pixel, clamped.
    packed = np.zeros(8, dtype=np.float32)
    packed[0] = 1.0
    planes = np.full((1, 1, 6), -1.0, dtype=np.float32)
    phases = np.empty(2 * 2 * 2 * 3, dtype=np.float32)
    filt = (packed, np.zeros(8, dtype=np.float32), 1)
    x -= 8.0
    taps = np.zeros(1, np.int64)
    direct_band(x, 0, (1, 5, 6), phases, (2, 2, 0, 0, 2, 3, 3), (0, 0, 2, 2), filt, taps, planes, True)
    if not np.array_equal(planes.reshape(2, 3), np.maximum(x.reshape(5, 6)[0:3:2, 0:6:2], 0)):
        raise RuntimeError("the compiled direct convolution band gives wrong results here")

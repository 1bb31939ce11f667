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

from ._nb import jit, wide_vectors

__all__ = ["im2col_block", "im2col_rows", "rows_scratch", "tap_offsets", "warm_up"]

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
    wide_vectors()
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
def _phase_rows(x, n, c, h0, h1, sw, pl, padded, phases):
    """Input rows ``[h0, h1)`` of channel ``c``, zero-padded on the left by ``pl``, split by column phase.

    ``phases[(h - h0) * sw + ph, j]`` = padded row ``h`` at column ``j * sw + ph`` (0 outside
    the image, and for rows outside it). ``padded`` is scratch of at least ``sw *
    phases.shape[1]`` floats that is not part of ``phases``' memory (were it, LLVM would
    have to assume the split overwrites its own source, and not vectorise it).
    """
    height, width = x.shape[2], x.shape[3]
    span = phases.shape[1]
    u0, u1 = max(0, pl), max(max(0, pl), min(sw * span, width + pl))
    for h in range(h0, h1):
        base = (h - h0) * sw
        if h < 0 or h >= height:
            for ph in range(sw):
                phases[base + ph, :] = 0
            continue
        row = x[n, c, h]
        for m in range(u0):
            padded[m] = 0
        for m in range(u1, sw * span):
            padded[m] = 0
        for m in range(u0, u1):
            padded[_U(m)] = row[_U(m - pl)]
        if sw == 1:
            phases[base, :] = padded[:span]
        elif sw == 2:
            even = phases[base]
            odd = phases[base + 1]
            for j in range(span):  # both members of the pair: shuffles, not gathers
                even[_U(j)] = padded[_U(2 * j)]
                odd[_U(j)] = padded[_U(2 * j + 1)]
        else:
            for ph in range(sw):
                line = phases[base + ph]
                for j in range(span):
                    line[j] = padded[j * sw + ph]


@jit
def im2col_rows(x, n, p0, p1, ow, geometry, cols, col0, buf):
    """:func:`im2col_block` for wide images: columns ``col0 ..`` for pixels ``[p0, p1)`` of image ``n``.

    Each needed input row is zero-padded and split by column phase once (stride 2: even
    and odd columns), after which every filter tap's row segment is one contiguous copy.
    ``geometry`` as in :func:`tap_offsets`; ``buf`` is float32 scratch of at least
    :func:`rows_scratch` elements.
    """
    wide_vectors()
    fh, fw, sh, sw, pt, pl, dh, dw = geometry
    cin = x.shape[1]
    oh0, oh1 = p0 // ow, (p1 - 1) // ow + 1
    h0 = oh0 * sh - pt
    h1 = (oh1 - 1) * sh - pt + (fh - 1) * dh + 1
    span = ow + ((fw - 1) * dw) // sw + 1
    padded = np.empty(sw * span, dtype=buf.dtype)
    phases = buf[: (h1 - h0) * sw * span].reshape(((h1 - h0) * sw, span))
    # The row segments of the block (one per output row it touches), found once: their
    # first column in the output row, length, and first padded input row (tap r = 0).
    segments = oh1 - oh0
    firsts = np.empty(segments, dtype=np.int64)
    lengths = np.empty(segments, dtype=np.int64)
    bases = np.empty(segments, dtype=np.int64)
    for q in range(segments):
        oh = oh0 + q
        start, stop = max(p0, oh * ow), min(p1, (oh + 1) * ow)
        firsts[q], lengths[q], bases[q] = start - oh * ow, stop - start, (oh * sh - pt - h0) * sw
    for c in range(cin):
        _phase_rows(x, n, c, h0, h1, sw, pl, padded, phases)
        for r in range(fh):
            for s in range(fw):
                crow = (c * fh + r) * fw + s
                phase, shift = (s * dw) % sw, (s * dw) // sw
                j = col0
                for q in range(segments):
                    prow = bases[q] + r * dh * sw + phase
                    at = firsts[q] + shift
                    seg = lengths[q]
                    # 2-D indices with unsigned column offsets: no view per segment and no
                    # negative-index fix-up, so this copy vectorises and costs only its loads.
                    for t in range(seg):
                        cols[crow, _U(j + t)] = phases[prow, _U(at + t)]
                    j += seg


def rows_scratch(p0: int, p1: int, ow: int, geometry: tuple[int, ...]) -> int:
    """Float32 elements of scratch one :func:`im2col_rows` call needs."""
    fh, fw, sh, sw, pt, pl, dh, dw = geometry
    oh0, oh1 = p0 // ow, (p1 - 1) // ow + 1
    rows = (oh1 - 1 - oh0) * sh + (fh - 1) * dh + 1
    span = ow + ((fw - 1) * dw) // sw + 1
    return rows * sw * span


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel for float32 and float64 now."""
    geometry = np.array([3, 3, 2, 2, 1, 1, 1, 1], dtype=np.int64)
    table = np.zeros((9, 4), dtype=np.int64)
    tap_offsets(0, 4, 2, geometry, 4, 4, table)
    for dtype in (np.float32, np.float64):
        x = np.zeros((1, 1, 4, 4), dtype=dtype)
        cols = np.zeros((9, 4), dtype=dtype)
        im2col_block(x, 0, table, cols, 0)
        buf = np.zeros(rows_scratch(0, 4, 2, tuple(int(g) for g in geometry)), dtype=np.float32)
        if dtype == np.float32:
            im2col_rows(x, 0, 0, 4, 2, geometry, cols, 0, buf)
        else:
            im2col_rows(x, 0, 0, 4, 2, geometry, cols, 0, buf.astype(dtype))

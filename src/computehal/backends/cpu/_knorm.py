"""Compiled normalisation kernels of the CPU backend (numba), for float32 and float64.

Each kernel reads its input once from memory: a row (layer / RMS normalisation) or a
channel plane (batch normalisation, LRN) is small enough to stay in cache between the
passes over it. Statistics accumulate in float64; loops index flat arrays with unsigned
offsets (a signed index makes numba test for negative indices, which stops
vectorisation). The formulas are the contract's, with one division by the standard
deviation replaced by a multiplication with its reciprocal (a rounding, not a NaN /
infinity difference: ``x * (1 / 0)`` and ``x / 0`` agree, as do ``0 * inf`` and
``0 / 0``).
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._kwrite import BLOCK, store_fence, stream_block, stream_head
from ._nb import as_float, as_int, jit, jit_reassoc, wide_vectors
from ._nb import sum32 as _sum32

__all__ = [
    "norm_rows",
    "norm_rows_f32",
    "affine_planes",
    "lrn_planes",
    "lrn_planes_f32",
    "lrn_pieces_f32",
    "warm_up",
]


_jit = jit
#: Kernels with sums: reassociation lets LLVM keep a vector of partial sums (no NaN or
#: infinity assumption is made).
_sums = jit_reassoc
_U = np.uint64


@_sums
def norm_rows(x: Any, out: Any, scale: Any, bias: Any, eps: float, rms: bool) -> None:
    """Layer (``rms`` False) or RMS normalisation of each row of 2-D ``x`` into ``out``.

    ``scale`` / ``bias`` have one entry per column (the caller passes 1 and 0 for
    omitted ones, as the formula says).
    """
    rows, cols = x.shape
    xf, of = x.reshape(-1), out.reshape(-1)
    typed = np.empty(2, dtype=out.dtype)  # the statistics in the data's own type, for the last pass
    for r in range(rows):
        base = _U(r * cols)
        mean = 0.0
        if not rms:
            total = 0.0
            for j in range(cols):
                total += np.float64(xf[base + _U(j)])
            mean = total / cols
        spread = 0.0
        for j in range(cols):
            d = np.float64(xf[base + _U(j)]) - mean
            spread += d * d
        typed[0] = mean
        typed[1] = 1.0 / math.sqrt(spread / cols + eps)
        m, inv = typed[0], typed[1]
        for j in range(cols):
            of[base + _U(j)] = (xf[base + _U(j)] - m) * inv * scale[j] + bias[j]


_F = np.float32
_F_ZERO = _F(0.0)


#: float32 sums of squares within these bounds lose nothing to overflow or underflow.
_BIG = _F(1e30)
_SMALL = _F(1e-30)


@_sums
def _row_stats64(row: Any, eps: float, rms: bool) -> tuple[float, float]:
    """Mean and ``1 / sqrt(variance + eps)`` of a row, from float64 sums."""
    cols = row.shape[0]
    mean = 0.0
    if not rms:
        total = 0.0
        for j in range(cols):
            total += np.float64(row[j])
        mean = total / cols
    spread = 0.0
    for j in range(cols):
        d = np.float64(row[j]) - mean
        spread += d * d
    return mean, 1.0 / math.sqrt(spread / cols + eps)


@_sums
def _squares32(row: Any, mean: float) -> float:
    """Sum of ``(row - mean)**2`` in float32 vector partial sums."""
    total = _F_ZERO
    for j in range(row.shape[0]):
        d = row[j] - mean
        total += d * d
    return total


@_jit
def norm_rows_f32(x: Any, out: Any, scale: Any, bias: Any, eps: float, rms: bool, stream: bool) -> None:
    """:func:`norm_rows` for float32, with float32 partial sums and optionally streaming stores.

    Each row is read from memory once: its sum and then its squared deviations from the
    mean are taken while it sits in L1, and the result is written (with ``stream``, through
    :mod:`._kwrite`'s non-temporal stores). The float32 sums are within the contract's
    ``(cols + 4) eps`` relative error (a plain sum's worst case is ``(cols - 1) eps``).
    """
    wide_vectors()
    rows, cols = x.shape
    buf = np.empty(BLOCK if stream else 0, dtype=np.float32)
    for r in range(rows):
        src = x[r]
        dst = out[r]
        mean = _F_ZERO if rms else _F(_sum32(src) / _F(cols))
        spread = _squares32(src, mean)
        if abs(mean) < _BIG and spread < _BIG and spread > _SMALL:
            inv = _F(1.0 / math.sqrt(np.float64(spread) / cols + eps))
        else:
            # Overflow, underflow, NaN or a constant row: float64 sums, as norm_rows.
            mean64, inv64 = _row_stats64(src, eps, rms)
            mean, inv = _F(mean64), _F(inv64)
        head = stream_head(dst, stream)
        for j in range(head):
            dst[j] = (src[j] - mean) * inv * scale[j] + bias[j]
        for b in range(head, cols, BLOCK):
            m = min(BLOCK, cols - b)
            part = src[b : b + m]
            s = scale[b : b + m]
            t = bias[b : b + m]
            for j in range(m):
                buf[j] = (part[j] - mean) * inv * s[j] + t[j]
            stream_block(buf, m, dst, b)
    if stream:
        store_fence()


@_jit
def affine_planes(x: Any, out: Any, first: int, mean: Any, factor: Any, bias: Any) -> None:
    """``out[p] = (x[p] - mean[c]) * factor[c] + bias[c]`` for planes ``p`` of 2-D ``x``.

    Plane ``p`` is global plane ``first + p``, of channel ``(first + p) % len(mean)``.
    """
    channels = mean.shape[0]
    for p in range(x.shape[0]):
        c = (first + p) % channels
        m = mean[c]
        f = factor[c]
        b = bias[c]
        src = x[p]
        dst = out[p]
        for j in range(src.shape[0]):
            dst[j] = (src[j] - m) * f + b


@_jit
def lrn_planes(x: Any, out: Any, j0: int, j1: int, size: int, alpha: float, beta: float, bias: float) -> None:
    """ONNX LRN over the channels of one image, columns ``[j0, j1)``: ``x`` and ``out`` are [C, S].

    ``y = x / (bias + alpha / size * sum(x[c'] ** 2)) ** beta`` over channels
    ``c - (size - 1) // 2`` to ``c + size // 2``, clipped to the image's channels; the
    common exponents go through square roots (``pow`` costs ~20 ns an element).
    """
    channels, spatial = x.shape
    xf, of = x.reshape(-1), out.reshape(-1)
    below, above = (size - 1) // 2, size // 2
    width = j1 - j0
    # Arithmetic in the data's own type (float32 sums of a few squares lose nothing that
    # shows after rounding; float32 square roots and divisions run twice as wide).
    total = np.empty(width, dtype=out.dtype)
    typed = np.empty(3, dtype=out.dtype)
    typed[0] = alpha / size
    typed[1] = bias
    typed[2] = beta
    coeff, offset, power = typed[0], typed[1], typed[2]
    for c in range(channels):
        lo, hi = max(0, c - below), min(channels - 1, c + above)
        for j in range(width):
            total[j] = 0.0
        for k in range(lo, hi + 1):
            src = _U(k * spatial + j0)
            for j in range(width):
                v = xf[src + _U(j)]
                total[j] += v * v
        for j in range(width):
            total[j] = offset + coeff * total[j]
        if beta == 0.75:
            for j in range(width):
                root = math.sqrt(total[j])
                total[j] = root * math.sqrt(root)
        elif beta == 0.5:
            for j in range(width):
                total[j] = math.sqrt(total[j])
        elif beta != 1.0:
            for j in range(width):
                total[j] = total[j] ** power
        at = _U(c * spatial + j0)
        for j in range(width):
            of[at + _U(j)] = xf[at + _U(j)] / total[j]


_I = np.int32
#: ``t ** -0.25`` to 10 % from the bits of ``t``: exponent and mantissa divided by -4.
_QUARTER_MAGIC = _I(0x4F580000)
_F_FIVE_QUARTERS = _F(1.25)
_F_QUARTER = _F(0.25)
#: The bit estimate and the Newton steps hold for ``t`` in these bounds.
_T_LO = _F(1e-30)
_T_HI = _F(1e30)


@_jit
def _inv_pow34(t: float) -> float:
    """``t ** -0.75`` for float32 ``t`` in [1e-30, 1e30], relative error below 6e-7 (5 eps).

    ``z = t ** -0.25`` from the bit estimate and three Newton steps on ``z**-4 = t``
    (``z <- z (5 - t z**4) / 4``, no division or square root), then ``z**3``.
    """
    z = as_float(_QUARTER_MAGIC - (as_int(t) >> 2))
    for _ in range(3):
        z2 = z * z
        z = z * (_F_FIVE_QUARTERS - _F_QUARTER * t * (z2 * z2))
    return z * z * z


#: Channels between window sums taken from scratch (the running sum in between).
_RESTART = 16


@_jit
def _window_sums(x: Any, j0: int, width: int, lo: int, hi: int, acc: Any, top: Any) -> None:
    """``acc[j] = top[j] = sum(x[k, j0 + j] ** 2 for k in [lo, hi])``."""
    wide_vectors()
    first = x[lo, j0 : j0 + width]
    for j in range(width):
        acc[j] = first[j] * first[j]
    for k in range(lo + 1, hi + 1):
        row = x[k, j0 : j0 + width]
        for j in range(width):
            acc[j] += row[j] * row[j]
    for j in range(width):
        top[j] = acc[j]


@_jit
def _lrn_planes_streamed(
    x: Any, out: Any, j0: int, j1: int, size: int, alpha: float, bias: float, stream: bool, total: Any
) -> None:
    """:func:`lrn_planes_f32` with non-temporal stores: the window sums taken from scratch
    for each channel into ``total``; parts of a channel row are computed into a small
    buffer and streamed out through :mod:`._kwrite`."""
    wide_vectors()
    channels, spatial = x.shape
    below, above = (size - 1) // 2, size // 2
    width = j1 - j0
    coeff = _F(alpha / size)
    offset = _F(bias)
    buf = np.empty(BLOCK if stream else 0, dtype=np.float32)
    acc = total[:width]
    for c in range(channels):
        lo, hi = max(0, c - below), min(channels - 1, c + above)
        first = x[lo, j0:j1]
        for j in range(width):
            acc[j] = first[j] * first[j]
        for k in range(lo + 1, hi + 1):
            row = x[k, j0:j1]
            for j in range(width):
                acc[j] += row[j] * row[j]
        bad = 0
        for j in range(width):
            t = offset + coeff * acc[j]
            bad += 0 if (t >= _T_LO and t <= _T_HI) else 1
        src = x[c, j0:j1]
        dst = out[c, j0:j1]
        if bad:
            for j in range(width):
                t = offset + coeff * acc[j]
                root = math.sqrt(t)
                dst[j] = src[j] / (root * math.sqrt(root))
            continue
        head = stream_head(dst, stream)
        for j in range(head):
            dst[j] = src[j] * _inv_pow34(offset + coeff * acc[j])
        for b in range(head, width, BLOCK):
            m = min(BLOCK, width - b)
            part = src[b : b + m]
            sums = acc[b : b + m]
            for j in range(m):
                buf[j] = part[j] * _inv_pow34(offset + coeff * sums[j])
            stream_block(buf, m, dst, b)
    if stream:
        store_fence()


@_sums
def lrn_planes_f32(
    x: Any, out: Any, j0: int, j1: int, size: int, alpha: float, bias: float, stream: bool, total: Any
) -> None:
    """:func:`lrn_planes` for float32 and ``beta = 0.75``, without divisions or square roots.

    The window sum of a channel comes from the previous one's (the entering channel's
    squares added, the leaving one's subtracted: two operations an element, not ``size``),
    taken from scratch every ``_RESTART`` channels and at the clipped edges. Its rounding
    stays under ``(23 + size) eps`` times ``top``, the largest sum since the restart; a
    channel row where ``|alpha| / size * top`` exceeds ``t / 4`` somewhere (the rounding
    could reach a few eps of ``t``), or where some ``t`` leaves [1e-30, 1e30] (or is NaN),
    is recomputed from scratch with the exact formula. ``x * t ** -0.75`` comes from
    :func:`_inv_pow34` (5 eps, against the contract's ``32 + 3 (size + 4)`` eps). With
    ``stream`` (output larger than the cache), :func:`_lrn_planes_streamed` runs instead,
    with ``total``: float32 scratch of at least ``j1 - j0``.
    """
    if stream:
        _lrn_planes_streamed(x, out, j0, j1, size, alpha, bias, True, total)
        return
    wide_vectors()
    channels = x.shape[0]
    below, above = (size - 1) // 2, size // 2
    width = j1 - j0
    coeff = _F(alpha / size)
    offset = _F(bias)
    scale = abs(coeff)  # the rounding bound, also for a negative alpha
    acc, top = np.empty(width, np.float32), np.empty(width, np.float32)
    for c in range(channels):
        lo, hi = max(0, c - below), min(channels - 1, c + above)
        src = x[c, j0:j1]
        dst = out[c, j0:j1]
        running = c % _RESTART != 0 and c - below > 0 and c + above < channels
        # Rows where some t leaves [1e-30, 1e30] (or is NaN), or where the running sum's
        # rounding may show, are recomputed below (a float count: it vectorises).
        bad = _F(0.0)
        if running:
            enter = x[hi, j0:j1]
            leave = x[lo - 1, j0:j1]
            for j in range(width):
                s = acc[j] + enter[j] * enter[j] - leave[j] * leave[j]
                acc[j] = s
                m = s if s > top[j] else top[j]
                top[j] = m
                t = offset + coeff * s
                ok = (t >= _T_LO) & (t <= _T_HI) & (scale * m <= _F(0.25) * t)
                bad += _F(0.0) if ok else _F(1.0)
                dst[j] = src[j] * _inv_pow34(t)
        else:
            _window_sums(x, j0, width, lo, hi, acc, top)
            for j in range(width):
                t = offset + coeff * acc[j]
                bad += _F(0.0) if (t >= _T_LO) & (t <= _T_HI) else _F(1.0)
                dst[j] = src[j] * _inv_pow34(t)
        if bad:
            _window_sums(x, j0, width, lo, hi, acc, top)
            for j in range(width):
                root = math.sqrt(offset + coeff * acc[j])
                dst[j] = src[j] / (root * math.sqrt(root))


@_jit
def lrn_pieces_f32(
    x: Any,
    out: Any,
    k0: int,
    k1: int,
    width: int,
    size: int,
    alpha: float,
    bias: float,
    stream: bool,
    total: Any,
) -> None:
    """:func:`lrn_planes_f32` on pieces ``[k0, k1)`` of [N, C, S] ``x``: piece ``k`` is image
    ``k // pieces`` (``pieces`` per image), columns from ``(k % pieces) * width``, ``width`` wide."""
    wide_vectors()
    spatial = x.shape[2]
    pieces = (spatial + width - 1) // width
    for k in range(k0, k1):
        i = k // pieces
        j0 = (k % pieces) * width
        lrn_planes_f32(x[i], out[i], j0, min(spatial, j0 + width), size, alpha, bias, stream, total)


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel for float32 and float64."""
    for dtype in (np.float32, np.float64):
        a = np.ones((2, 3), dtype=dtype)
        v = np.ones(3, dtype=dtype)
        for rms in (False, True):
            norm_rows(a, a.copy(), v, v, 1e-5, rms)
            if dtype == np.float32:
                for stream in (False, True):
                    norm_rows_f32(a, a.copy(), v, v, 1e-5, rms, stream)
        affine_planes(a, a.copy(), 0, v[:2], v[:2], v[:2])
        lrn_planes(a, a.copy(), 0, 3, 3, 1e-4, 0.75, 1.0)
    a = np.ones((2, 3), dtype=np.float32)
    for stream in (False, True):
        lrn_planes_f32(a, a.copy(), 0, 3, 3, 1e-4, 1.0, stream, np.empty(3, dtype=np.float32))
        lrn_pieces_f32(a[None], a[None].copy(), 0, 2, 2, 3, 1e-4, 1.0, stream, np.empty(2, dtype=np.float32))

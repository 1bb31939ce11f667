"""Compiled normalisation kernels of the CPU backend (numba), for float32 and float64.

Each kernel reads its input once from memory: a row (layer / RMS normalisation) or a
channel plane (batch normalisation, LRN) is small enough to stay in cache between the
passes over it. Statistics accumulate in float64. The formulas are the contract's,
with one division by the standard deviation replaced by a multiplication with its
reciprocal (a rounding, not a NaN / infinity difference: ``x * (1 / 0)`` and
``x / 0`` agree, as do ``0 * inf`` and ``0 / 0``).
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

__all__ = ["norm_rows", "affine_planes", "lrn_planes", "warm_up"]


def _jit(fn: Any) -> Any:
    options: dict[str, Any] = dict(nogil=True, error_model="numpy", fastmath={"contract"})
    try:
        return numba.njit(cache=True, **options)(fn)
    except RuntimeError:  # no writable cache location
        return numba.njit(cache=False, **options)(fn)


@_jit
def norm_rows(x: Any, out: Any, scale: Any, bias: Any, eps: float, rms: bool) -> None:
    """Layer (``rms`` False) or RMS normalisation of each row of 2-D ``x`` into ``out``.

    ``scale`` / ``bias`` have one entry per column, or none (then 1 and 0).
    """
    rows, cols = x.shape
    has_scale = scale.shape[0] > 0
    has_bias = bias.shape[0] > 0
    for r in range(rows):
        row = x[r]
        dst = out[r]
        mean = 0.0
        if not rms:
            total = 0.0
            for j in range(cols):
                total += row[j]
            mean = total / cols
        spread = 0.0
        for j in range(cols):
            d = row[j] - mean
            spread += d * d
        inv = 1.0 / math.sqrt(spread / cols + eps)
        for j in range(cols):
            y = (row[j] - mean) * inv
            if has_scale:
                y = y * scale[j]
            if has_bias:
                y = y + bias[j]
            dst[j] = y


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
def _power(d: float, beta: float) -> float:
    """``d ** beta``, with the common exponents through square roots (pow costs ~20 ns)."""
    if beta == 0.75:
        root = math.sqrt(d)
        return root * math.sqrt(root)
    if beta == 0.5:
        return math.sqrt(d)
    if beta == 1.0:
        return d
    return d**beta


@_jit
def lrn_planes(x: Any, out: Any, size: int, alpha: float, beta: float, bias: float) -> None:
    """ONNX LRN over the channels of one image: ``x`` and ``out`` are [C, S].

    ``y = x / (bias + alpha / size * sum(x[c'] ** 2)) ** beta`` over channels
    ``c - (size - 1) // 2`` to ``c + size // 2``, clipped to the image's channels.
    """
    channels, spatial = x.shape
    below, above = (size - 1) // 2, size // 2
    coeff = alpha / size
    total = np.empty(spatial, dtype=np.float64)
    for c in range(channels):
        lo, hi = max(0, c - below), min(channels - 1, c + above)
        for j in range(spatial):
            total[j] = 0.0
        for k in range(lo, hi + 1):
            src = x[k]
            for j in range(spatial):
                v = np.float64(src[j])
                total[j] += v * v
        src = x[c]
        dst = out[c]
        for j in range(spatial):
            dst[j] = src[j] / _power(bias + coeff * total[j], beta)


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel for float32 and float64."""
    for dtype in (np.float32, np.float64):
        a = np.ones((2, 3), dtype=dtype)
        v = np.ones(3, dtype=dtype)
        none = np.empty(0, dtype=dtype)
        for rms in (False, True):
            norm_rows(a, a.copy(), v, v, 1e-5, rms)
            norm_rows(a, a.copy(), none, none, 1e-5, rms)
        affine_planes(a, a.copy(), 0, v[:2], v[:2], v[:2])
        lrn_planes(a, a.copy(), 3, 1e-4, 0.75, 1.0)
        lrn_planes(a[:, :2], a.copy()[:, :2], 3, 1e-4, 0.75, 1.0)  # column bands of an image

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

from ._nb import jit, jit_reassoc

__all__ = ["norm_rows", "affine_planes", "lrn_planes", "warm_up"]


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


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel for float32 and float64."""
    for dtype in (np.float32, np.float64):
        a = np.ones((2, 3), dtype=dtype)
        v = np.ones(3, dtype=dtype)
        for rms in (False, True):
            norm_rows(a, a.copy(), v, v, 1e-5, rms)
        affine_planes(a, a.copy(), 0, v[:2], v[:2], v[:2])
        lrn_planes(a, a.copy(), 0, 3, 3, 1e-4, 0.75, 1.0)

"""Compiled depthwise convolution of the CPU backend (numba), for float32 and float64.

Each output channel plane is one input channel plane filtered by its own ``Fh x Fw``
taps: output rows are built one at a time, each filter row inside the image adding
``Fw`` scaled, strided input row segments (the inner loop runs along the output row and
vectorises). Taps outside the image are never read, so padding never meets a NaN.
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numpy as np

from ._kpool import column_plan, tap_range
from ._nb import jit

__all__ = ["depthwise_planes", "warm_up"]

_U = np.uint64


_jit = jit


@_jit
def depthwise_planes(x: Any, f: Any, bias: Any, out: Any, first: int, channels: int, geometry: Any) -> None:
    """Output planes ``first ..`` of a depthwise convolution.

    ``x`` is [N * C, H, W], ``f`` [K, Fh, Fw] (K = C * multiplier), ``bias`` K values or
    none, ``out`` [P, Oh, Ow] holds global output planes ``first`` to ``first + P - 1``
    (plane ``q`` is image ``q // K``, channel ``q % K``, reading input channel
    ``(q % K) // multiplier``). ``geometry`` is (sh, sw, pt, pl, dh, dw) as int64.
    Operands are C-contiguous; loops index them flat with unsigned offsets, so that
    LLVM vectorises them (see :mod:`._kpool`).
    """
    sh, sw, pt, pl, dh, dw = geometry
    h, w = x.shape[1], x.shape[2]
    k_total, fh, fw = f.shape
    mult = k_total // channels
    oh, ow = out.shape[1], out.shape[2]
    xf, of = x.reshape(-1), out.reshape(-1)
    plan = column_plan(fw, sw, pl, dw, ow, w)
    acc = np.empty(ow, dtype=out.dtype)
    for p in range(out.shape[0]):
        q = first + p
        k = q % k_total
        plane = ((q // k_total) * channels + k // mult) * h * w
        start = bias[k] if bias.shape[0] > 0 else 0.0
        for i in range(oh):
            for j in range(ow):
                acc[j] = start
            r0, r1 = tap_range(i, sh, pt, dh, fh, h)
            for r in range(r0, r1):
                row = plane + (i * sh - pt + r * dh) * w
                for s in range(fw):
                    n = plan[s, 1]
                    j0 = _U(plan[s, 0])
                    src = _U(row + plan[s, 2])
                    weight = f[k, r, s]
                    if sw == 1:
                        for t in range(n):
                            acc[j0 + _U(t)] += weight * xf[src + _U(t)]
                    elif sw == 2:
                        for t in range(n):
                            acc[j0 + _U(t)] += weight * xf[src + _U(2 * t)]
                    else:
                        for t in range(n):
                            acc[j0 + _U(t)] += weight * xf[src + _U(t * sw)]
            base = _U((p * oh + i) * ow)
            for j in range(ow):
                of[base + _U(j)] = acc[j]


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel for float32 and float64."""
    geometry = np.array([1, 1, 0, 0, 1, 1], dtype=np.int64)
    for dtype in (np.float32, np.float64):
        x = np.ones((1, 2, 2), dtype=dtype)
        f = np.ones((1, 2, 2), dtype=dtype)
        out = np.empty((1, 1, 1), dtype=dtype)
        for bias in (np.ones(1, dtype=dtype), np.empty(0, dtype=dtype)):
            depthwise_planes(x, f, bias, out, 0, 1, geometry)

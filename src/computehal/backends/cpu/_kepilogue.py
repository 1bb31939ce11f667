"""Compiled convolution epilogue of the CPU backend (numba): residual and ReLU in one pass.

``add_relu_into(y, r)`` sets ``y = relu(y + r)``, ``add_into(y, r)`` sets ``y += r`` and
``relu_into(y)`` sets ``y = relu(y)``, each one read and one write of ``y`` (plus one
read of ``r``), vectorised with the CPU's widest vectors; ``relu_region`` applies ReLU
to a block of a convolution's [N, K, pixels] output while the algorithm has it in
cache. RELU maps NaN to 0, as the ``unary`` RELU does (``v > 0`` is false for NaN).
1-D float32 or float64 arrays (``relu_region``: 3-D); ``r`` must not overlap ``y``.
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numpy as np

from ._nb import jit, wide_vectors

__all__ = ["add_into", "add_relu_into", "relu_into", "relu_region", "warm_up"]

_ZERO = np.float32(0.0)


@jit
def add_relu_into(y: Any, r: Any) -> None:
    """``y[i] = relu(y[i] + r[i])`` (NaN -> 0)."""
    wide_vectors()
    for i in range(y.shape[0]):
        v = y[i] + r[i]
        y[i] = v if v > _ZERO else _ZERO


@jit
def add_into(y: Any, r: Any) -> None:
    """``y[i] += r[i]``."""
    wide_vectors()
    for i in range(y.shape[0]):
        y[i] = y[i] + r[i]


@jit
def relu_into(y: Any) -> None:
    """``y[i] = relu(y[i])`` (NaN -> 0)."""
    wide_vectors()
    for i in range(y.shape[0]):
        v = y[i]
        y[i] = v if v > _ZERO else _ZERO


@jit
def relu_region(y: Any, n0: int, n1: int, k0: int, k1: int, p0: int, p1: int) -> None:
    """``y[n, k, p] = relu(y[n, k, p])`` (NaN -> 0) over ``[n0, n1) x [k0, k1) x [p0, p1)`` of 3-D ``y``.

    A convolution's output block (images, channels, pixels) while it is in cache. Each
    row is a slice indexed from 0 (an index starting at ``p0`` would get numba's
    negative-index fix-up and not vectorise).
    """
    wide_vectors()
    for n in range(n0, n1):
        for k in range(k0, k1):
            row = y[n, k, p0:p1]
            for p in range(row.shape[0]):
                v = row[p]
                row[p] = v if v > _ZERO else _ZERO


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel for float32 and float64."""
    for dtype in (np.float32, np.float64):
        a, b = np.zeros(4, dtype=dtype), np.ones(4, dtype=dtype)
        add_relu_into(a, b)
        add_into(a, b)
        relu_into(a)
        relu_region(a.reshape(1, 2, 2), 0, 1, 0, 2, 0, 2)

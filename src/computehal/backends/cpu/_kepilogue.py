"""Compiled convolution epilogue of the CPU backend (numba): residual and ReLU in one pass.

``add_relu_into(y, r)`` sets ``y = relu(y + r)``, ``add_into(y, r)`` sets ``y += r`` and
``relu_into(y)`` sets ``y = relu(y)``, each one read and one write of ``y`` (plus one
read of ``r``), vectorised with the CPU's widest vectors. RELU maps NaN to 0, as the
``unary`` RELU does (``v > 0`` is false for NaN). 1-D float32 or float64 arrays; ``r``
must not overlap ``y``.
"""

# Function bodies are numba nopython code, which mypy cannot type.
# mypy: ignore-errors

from __future__ import annotations

from typing import Any

import numpy as np

from ._nb import jit, wide_vectors

__all__ = ["add_into", "add_relu_into", "relu_into", "warm_up"]

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


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel for float32 and float64."""
    for dtype in (np.float32, np.float64):
        a, b = np.zeros(4, dtype=dtype), np.ones(4, dtype=dtype)
        add_relu_into(a, b)
        add_into(a, b)
        relu_into(a)

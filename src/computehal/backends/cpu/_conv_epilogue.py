"""The convolution epilogue on the CPU: ``y = activation(y + residual)`` in one pass over ``y``.

The convolution's own algorithm writes ``y`` (with the bias); this pass then adds the
residual and applies the activation while each part of ``y`` is in cache: ReLU and the
residual alone through the compiled kernels of :mod:`._kepilogue`, every other
activation block by block (the residual added, then the ``unary`` op's own block
function of :mod:`._elementwise`, so the values are exactly those of ``unary``).
"""

from __future__ import annotations

import numpy as np

from ... import validation as v
from ...types import UnaryOp
from ._elementwise import _UNARY, BLOCK
from ._plumbing import FloatArray
from ._runtime import kernels, parallel_ranges

__all__ = ["apply_epilogue", "relu_fusable", "relu_in_place"]


def relu_fusable(p: v.ConvProblem) -> bool:
    """True when the epilogue of ``p`` is a ReLU alone (the algorithms may apply it as they store)."""
    return (
        isinstance(p, v.ConvForwardProblem)
        and p.residual is None
        and p.activation is UnaryOp.RELU
        and kernels("_kepilogue") is not None
    )


def relu_in_place(y: FloatArray) -> None:
    """``y = relu(y)`` (NaN -> 0) over a C-contiguous ``y`` of any shape, split over the threads."""
    flat = y.reshape(-1)
    compiled = kernels("_kepilogue")
    parallel_ranges(flat.size, lambda lo, hi: compiled.relu_into(flat[lo:hi]))


def apply_epilogue(y: FloatArray, r: FloatArray | None, p: v.ConvForwardProblem) -> None:
    """``y = p.activation(y + r)`` in place (1-D ``y``; ``r`` None or disjoint from ``y``)."""
    act = p.activation
    compiled = kernels("_kepilogue") if act in (None, UnaryOp.RELU) else None
    if compiled is not None:
        if r is None:
            parallel_ranges(y.size, lambda lo, hi: compiled.relu_into(y[lo:hi]))
        elif act is UnaryOp.RELU:
            parallel_ranges(y.size, lambda lo, hi: compiled.add_relu_into(y[lo:hi], r[lo:hi]))
        else:
            parallel_ranges(y.size, lambda lo, hi: compiled.add_into(y[lo:hi], r[lo:hi]))
        return
    fn = None if act is None else _UNARY[act]
    unary = None if act is None else v.ElementwiseProblem(act, y.size, p.y, None, p.y, p.dtype)

    def run(start: int, stop: int) -> None:
        size = min(BLOCK, stop - start)
        out, tmp = np.empty(size, dtype=y.dtype), np.empty(size, dtype=y.dtype)
        with np.errstate(all="ignore"):
            for lo in range(start, stop, BLOCK):
                hi = min(stop, lo + BLOCK)
                block = y[lo:hi]
                if r is not None:
                    np.add(block, r[lo:hi], out=block)
                if fn is not None and unary is not None:
                    # Not in place: the compiled float32 functions vectorise only without aliasing.
                    fn(block, out[: hi - lo], tmp[: hi - lo], unary)
                    block[...] = out[: hi - lo]

    parallel_ranges(y.size, run)

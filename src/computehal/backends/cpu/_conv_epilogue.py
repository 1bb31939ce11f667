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

__all__ = ["apply_epilogue", "epilogue_range", "finish_epilogue", "relu_in_place"]


def epilogue_range(y: FloatArray, r: FloatArray | None, relu: bool) -> None:
    """``y = relu(y + r)`` (or without ``r`` / ReLU) on 1-D float32 ranges, on this thread (compiled)."""
    compiled = kernels("_kepilogue")
    if r is None:
        if relu:
            compiled.relu_into(y)
    elif relu:
        compiled.add_relu_into(y, r)
    else:
        compiled.add_into(y, r)


def finish_epilogue(y: FloatArray, r: FloatArray | None, relu: bool) -> None:
    """:func:`epilogue_range` over a C-contiguous ``y`` of any shape, split over the threads.

    ``r``: None or 1-D, laid out as ``y``.
    """
    if r is None and not relu:
        return
    flat = y.reshape(-1)
    if r is None:
        parallel_ranges(flat.size, lambda lo, hi: epilogue_range(flat[lo:hi], None, True))
    else:
        parallel_ranges(flat.size, lambda lo, hi: epilogue_range(flat[lo:hi], r[lo:hi], relu))


def relu_in_place(y: FloatArray) -> None:
    """``y = relu(y)`` (NaN -> 0) over a C-contiguous ``y`` of any shape, split over the threads."""
    finish_epilogue(y, None, True)


def apply_epilogue(y: FloatArray, r: FloatArray | None, p: v.ConvForwardProblem) -> None:
    """``y = p.activation(y + r)`` in place (1-D ``y``; ``r`` None or disjoint from ``y``)."""
    act = p.activation
    if act in (None, UnaryOp.RELU) and kernels("_kepilogue") is not None:
        finish_epilogue(y, r, act is UnaryOp.RELU)
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

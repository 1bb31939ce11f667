"""Softmax and log-softmax with the fused kernels of :mod:`._ksoftmax`, split over the worker threads.

Rows (``inner == 1``) go to the threads in contiguous ranges; a strided axis is split
into column ranges of each outer slice, at least :data:`MIN_COLUMNS` wide so that
every row segment a thread streams is long. Each thread keeps its scratch between
calls (:func:`._conv_winograd.thread_scratch`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import validation as v
from ._plumbing import FloatArray
from ._runtime import PARALLEL_THRESHOLD, kernels, parallel_ranges, workers
from ._scratch import thread_scratch

__all__ = ["fast_softmax"]

#: Elements below which a call stays with the general path (no thread split to pay for).
MIN_ELEMENTS = 1 << 12
#: Narrowest column range of the strided-axis kernel.
MIN_COLUMNS = 64


def fast_softmax(p: v.AxisProblem, x: FloatArray, out: FloatArray) -> bool:
    """(Log-)softmax of ``x`` [outer, length, inner] into ``out``; False where this path does not apply.

    ``out`` is ``x`` or does not overlap it.
    """
    if p.dtype != np.float32 or x.size < MIN_ELEMENTS or p.length == 0:
        return False
    kern: Any = kernels("_ksoftmax")
    if kern is None:
        return False
    if p.inner == 1:
        rows_x = x.reshape(p.outer, p.length)
        rows_out = out.reshape(p.outer, p.length)

        def run_rows(start: int, stop: int) -> None:
            scratch = thread_scratch("softmax-row", p.length)
            kern.softmax_rows(rows_x, rows_out, start, stop, p.log, scratch)

        parallel_ranges(p.outer, run_rows, grain=max(1, PARALLEL_THRESHOLD // p.length))
        return True
    width = max(MIN_COLUMNS, -(-p.inner // workers()))
    panels = [(o, c0, min(p.inner, c0 + width)) for o in range(p.outer) for c0 in range(0, p.inner, width)]

    def run_panels(start: int, stop: int) -> None:
        for o, c0, c1 in panels[start:stop]:
            work = thread_scratch("softmax-columns", 5 * (c1 - c0))[: 5 * (c1 - c0)].reshape(5, c1 - c0)
            kern.softmax_columns(x[o], out[o], c0, c1, p.log, work)

    parallel_ranges(len(panels), run_panels, grain=max(1, PARALLEL_THRESHOLD // (p.length * width)))
    return True

"""Data movement on the CPU: device copies, fills, strided copies, row gather and scatter."""

from __future__ import annotations

import numpy as np

from ... import validation as v
from .._common import refuse_extensions
from ._plumbing import CpuPlumbing
from ._runtime import PARALLEL_THRESHOLD, parallel_ranges

__all__ = ["MovementOps"]


class MovementOps(CpuPlumbing):
    """``copy_dtod``, ``fill``, ``gather`` and ``scatter``."""

    def _exec_copy_dtod(self, p: v.CopyProblem) -> None:
        self._bytes(p.dst)[:] = self._bytes(p.src)

    def _exec_fill(self, p: v.FillProblem) -> None:
        with np.errstate(over="ignore"):
            self._flat(p.region, p.dtype)[:] = np.asarray(p.value, dtype=np.float64).astype(p.dtype)

    def _exec_gather(self, p: v.RowsProblem) -> None:
        refuse_extensions("cpu", "gather", p)
        indices = p.indices
        assert indices is not None
        if p.cols == 0:
            return
        table = self._array(p.input, (p.rows, p.cols), p.dtype)
        out = self._array(p.output, (indices.size, p.cols), p.dtype)

        def run(start: int, stop: int) -> None:
            # The indices were validated; mode="clip" lets take() write straight into
            # `out` (mode="raise" buffers the whole result and copies it again).
            np.take(table, indices[start:stop], axis=0, out=out[start:stop], mode="clip")

        parallel_ranges(indices.size, run, grain=max(1, PARALLEL_THRESHOLD // p.cols))

    def _exec_scatter(self, p: v.RowsProblem) -> None:
        refuse_extensions("cpu", "scatter", p)
        indices = p.indices
        assert indices is not None
        if indices.size == 0 or p.cols == 0:
            return
        src = self._array(p.input, (indices.size, p.cols), p.dtype)
        out = self._array(p.output, (p.rows, p.cols), p.dtype)
        destinations, sources = v.last_occurrences(indices)
        grain = max(1, PARALLEL_THRESHOLD // p.cols)
        if destinations.size == indices.size:
            # Distinct rows: every source row lands once, in any order.
            def run_distinct(start: int, stop: int) -> None:
                out[indices[start:stop]] = src[start:stop]

            parallel_ranges(indices.size, run_distinct, grain=grain)
            return
        chunk = max(1, min(256, (1 << 16) // p.cols))

        def run(start: int, stop: int) -> None:
            buffer = np.empty((min(chunk, stop - start), p.cols), dtype=p.dtype)
            for lo in range(start, stop, chunk):
                hi = min(stop, lo + chunk)
                rows = buffer[: hi - lo]
                np.take(src, sources[lo:hi], axis=0, out=rows, mode="clip")
                out[destinations[lo:hi]] = rows

        parallel_ranges(destinations.size, run, grain=grain)

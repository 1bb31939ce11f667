"""Data movement on OpenCL: device copies, fills, row gather and scatter (``kernels/gather.cl``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from ... import validation as v
from ._core import OpenCLCore
from ._runtime import check

__all__ = ["MovementOps"]

I64 = np.int64


class MovementOps(OpenCLCore):
    """copy_dtod, fill, gather and scatter."""

    def _exec_copy_dtod(self, p: v.CopyProblem) -> None:
        with self._lock, check("copying on the device", p.nbytes):
            cl.enqueue_copy(
                self._queue, p.dst.payload, p.src.payload, byte_count=p.nbytes,
                src_offset=p.src.offset, dst_offset=p.dst.offset,
            )  # fmt: skip

    def _exec_fill(self, p: v.FillProblem) -> None:
        y = self._at(p.region)
        with self._lock:
            kernel = self._kernel("elementwise.cl", "fill_f32", EW=self._ew)
            self._launch(
                kernel, (p.count,), (min(256, self._max_wg),),
                y.buffer, I64(y.offset), np.float32(p.value), I64(p.count),
            )  # fmt: skip

    def _upload_indices(self, values: np.ndarray[Any, Any]) -> Any:
        data = np.ascontiguousarray(values, dtype=np.int64)
        with check("uploading indices", data.nbytes):
            return cl.Buffer(self._context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)

    def _rows_local(self, cols: int) -> tuple[int, int]:
        return min(64, (cols + 7) // 8 * 8, self._max_wg), 1

    def _exec_gather(self, p: v.RowsProblem) -> None:
        assert p.indices is not None
        count = int(p.indices.size)
        x, y = self._at(p.input), self._at(p.output)
        with self._lock:
            idx = self._upload_indices(p.indices)
            kernel = self._kernel("gather.cl", "gather_rows")
            self._launch(
                kernel, (p.cols, count), self._rows_local(p.cols),
                x.buffer, I64(x.offset), idx, y.buffer, I64(y.offset), I64(p.cols), I64(count),
            )  # fmt: skip

    def _exec_scatter(self, p: v.RowsProblem) -> None:
        assert p.indices is not None
        if p.indices.size == 0:
            return
        # Each destination row once, with the last source naming it.
        destinations, sources = v.last_occurrences(p.indices)
        count = int(destinations.size)
        x, y = self._at(p.input), self._at(p.output)
        with self._lock:
            src = self._upload_indices(sources)
            dst = self._upload_indices(destinations)
            kernel = self._kernel("gather.cl", "scatter_rows")
            self._launch(
                kernel, (p.cols, count), self._rows_local(p.cols),
                x.buffer, I64(x.offset), src, dst, y.buffer, I64(y.offset), I64(p.cols), I64(count),
            )  # fmt: skip

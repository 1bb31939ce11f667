"""Data movement on OpenCL: device copies, fills, strided copies, row gather and scatter.

Everything here is a bit copy of 16-, 32- or 64-bit elements (``kernels/movement.cl``,
the fills of ``kernels/elementwise.cl``), so it takes every storage dtype natively and NaN
payloads survive. Device-side indices are checked on the device (their smallest and
largest value are folded there and only those two numbers are read back) before
anything is written.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from ... import validation as v
from ...errors import InvalidArgumentError, UnsupportedError
from .._common import ceil_div, collapse, fill_pattern
from ._core import OpenCLCore
from ._runtime import Operand, check, outer_args

__all__ = ["MovementOps"]

I64 = np.int64


class MovementOps(OpenCLCore):
    """copy_dtod, fill, copy_strided, gather and scatter."""

    def _exec_copy_dtod(self, p: v.CopyProblem) -> None:
        if p.src == p.dst:
            return
        with self._lock, check("copying on the device", p.nbytes):
            cl.enqueue_copy(
                self._queue, p.dst.payload, p.src.payload, byte_count=p.nbytes,
                src_offset=p.src.offset, dst_offset=p.dst.offset,
            )  # fmt: skip

    def _fill_bits(self, buffer: Any, offset: int, count: int, pattern: Any) -> None:
        bits = pattern.dtype.itemsize * 8
        kernel = self._kernel("elementwise.cl", f"fill_u{bits}")
        self._launch(kernel, (count,), (min(256, self._max_wg),), buffer, I64(offset), pattern, I64(count))

    def _exec_fill(self, p: v.FillProblem) -> None:
        y = self._at(p.region, p.dtype.itemsize)
        with self._lock:
            self._fill_bits(y.buffer, y.offset, p.count, fill_pattern(p.value, p.dtype))

    def _exec_copy_strided(self, p: v.StridedProblem) -> None:
        size = p.dtype.itemsize
        src, dst = self._at(p.src, size), self._at(p.dst, size)
        dims, (ss, ds) = collapse(p.shape, p.src_strides, p.dst_strides)
        inner, run = dims[-1], self._run()
        with self._lock:
            kernel = self._kernel("movement.cl", f"copy_strided_{size * 8}")
            self._launch(
                kernel, (ceil_div(inner, run), p.size // inner), self._strided_local(),
                src.buffer, I64(src.offset + p.src_origin), dst.buffer, I64(dst.offset + p.dst_origin),
                I64(inner), I64(run), I64(ss[-1]), I64(ds[-1]), *outer_args(dims, ss, ds),
            )  # fmt: skip

    # ------------------------------------------------------------------ gather / scatter

    def _upload_indices(self, values: np.ndarray[Any, Any]) -> Any:
        data = np.ascontiguousarray(values, dtype=np.int64)
        with check("uploading indices", data.nbytes):
            return cl.Buffer(self._context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)

    def _rows_local(self, cols: int) -> tuple[int, int]:
        return min(64, (cols + 7) // 8 * 8, self._max_wg), 1

    def _device_indices(self, p: v.RowsProblem) -> tuple[Operand, str]:
        """The device indices of ``p``, checked on the device against ``p.rows`` (hold the lock)."""
        assert p.index is not None and p.index_dtype is not None
        itemsize = p.index_dtype.itemsize
        idx, kind = self._at(p.index, itemsize), f"i{itemsize * 8}"
        ls = self._pow2_group(256)
        found = self._scratch_buffer("index_range", 16)
        kernel = self._kernel("movement.cl", f"index_range_{kind}", LS=ls)
        self._launch(kernel, (ls,), (ls,), idx.buffer, I64(idx.offset), I64(p.count), found)
        low_high = np.empty(2, dtype=np.int64)
        with check("reading the index range", 16):
            cl.enqueue_copy(self._queue, low_high, found, is_blocking=True)
        low, high = int(low_high[0]), int(low_high[1])
        if low < 0:
            raise InvalidArgumentError(f"index {low} is negative")
        if high >= p.rows:
            raise InvalidArgumentError(f"index {high} is out of range for {p.rows} rows")
        return idx, kind

    def _exec_gather(self, p: v.RowsProblem) -> None:
        size = p.dtype.itemsize
        x, y = self._at(p.input, size), self._at(p.output, size)
        with self._lock:
            if p.cols == 0:  # nothing to copy, but device indices are still checked
                if p.indices is None:
                    self._device_indices(p)
                return
            if p.indices is not None:
                idx, kind = Operand(self._upload_indices(p.indices), 0), "i64"
            else:
                idx, kind = self._device_indices(p)
            kernel = self._kernel("movement.cl", f"gather_{size * 8}_{kind}")
            self._launch(
                kernel, (p.cols, p.count), self._rows_local(p.cols),
                x.buffer, I64(x.offset), idx.buffer, I64(idx.offset), y.buffer, I64(y.offset),
                I64(p.cols), I64(p.count),
            )  # fmt: skip

    def _exec_scatter(self, p: v.RowsProblem) -> None:
        if p.cols == 0:  # nothing to copy, but device indices are still checked
            if p.indices is None:
                with self._lock:
                    self._device_indices(p)
            return
        size = p.dtype.itemsize
        x, y = self._at(p.input, size), self._at(p.output, size)
        with self._lock:
            if p.indices is None:
                self._scatter_device(p, x, y)
                return
            # Host indices: each destination row once, with the last source naming it.
            destinations, sources = v.last_occurrences(p.indices)
            src, dst = self._upload_indices(sources), self._upload_indices(destinations)
            kernel = self._kernel("movement.cl", f"scatter_pairs_{size * 8}")
            self._launch(
                kernel, (p.cols, destinations.size), self._rows_local(p.cols),
                x.buffer, I64(x.offset), src, dst, I64(0), y.buffer, I64(y.offset), I64(p.cols),
                I64(destinations.size),
            )  # fmt: skip

    def _scatter_device(self, p: v.RowsProblem, x: Operand, y: Operand) -> None:
        """Scatter with device indices: claim each destination row for its last index, then copy."""
        if p.count > np.iinfo(np.int32).max:
            raise UnsupportedError("scatter with more than 2**31 - 1 device indices")
        idx, kind = self._device_indices(p)
        winner = self._scratch_buffer("scatter_winner", p.rows * 4)
        self._fill_bits(winner, 0, p.rows, np.uint32(0xFFFFFFFF))
        claim = self._kernel("movement.cl", f"scatter_claim_{kind}")
        local = (min(64, self._max_wg),)
        self._launch(claim, (p.count,), local, idx.buffer, I64(idx.offset), I64(p.count), winner)
        won = self._kernel("movement.cl", f"scatter_won_{p.dtype.itemsize * 8}_{kind}")
        self._launch(
            won, (p.cols, p.count), self._rows_local(p.cols),
            x.buffer, I64(x.offset), idx.buffer, I64(idx.offset), winner, y.buffer, I64(y.offset),
            I64(p.cols), I64(p.count),
        )  # fmt: skip

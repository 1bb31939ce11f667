"""Data movement on the CPU: device copies, fills, strided copies, row gather and scatter.

Copies are bit copies through unsigned-integer views, so NaN payloads survive. Large
problems split over the worker threads.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import numpy.typing as npt

from ... import validation as v
from ...errors import InvalidArgumentError
from .._common import fill_pattern
from ._plumbing import CpuPlumbing
from ._runtime import PARALLEL_THRESHOLD, kernels, parallel_ranges
from ._strided import STREAM_MIN_BYTES, copy_layout, simplify

__all__ = ["MovementOps"]

#: The unsigned type of each element size: strided copies move bits, not values.
_BITS: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
    8: np.dtype(np.uint64),
}
#: Bytes per thread share of a plain copy or fill.
_COPY_GRAIN = 1 << 20


class MovementOps(CpuPlumbing):
    """``copy_dtod``, ``fill``, ``copy_strided``, ``gather`` and ``scatter``."""

    def _exec_copy_dtod(self, p: v.CopyProblem) -> None:
        src, dst = self._bytes(p.src), self._bytes(p.dst)
        if p.src.overlaps(p.dst):
            dst[:] = src  # the very same range (NumPy copies any other overlap through a buffer)
            return

        def run(start: int, stop: int) -> None:
            np.copyto(dst[start:stop], src[start:stop])

        parallel_ranges(p.nbytes, run, grain=_COPY_GRAIN)

    def _exec_fill(self, p: v.FillProblem) -> None:
        pattern = fill_pattern(p.value, p.dtype)  # rounded once to the dtype, as bits
        if p.count * p.dtype.itemsize >= STREAM_MIN_BYTES and self._fill_streamed(p, pattern):
            return
        raw = np.frombuffer(pattern.tobytes(), dtype=np.uint8)
        if (raw == raw[0]).all():
            # One repeated byte (0.0, say): memset, whose streaming stores skip reading the lines.
            byte, base = int(raw[0]), p.region.ptr

            def run_bytes(start: int, stop: int) -> None:
                ctypes.memset(base + start, byte, stop - start)

            parallel_ranges(p.count * p.dtype.itemsize, run_bytes, grain=_COPY_GRAIN)
            return
        out = self._flat(p.region, pattern.dtype)[: p.count]

        def run(start: int, stop: int) -> None:
            out[start:stop] = pattern

        parallel_ranges(p.count, run, grain=max(1, _COPY_GRAIN // p.dtype.itemsize))

    def _fill_streamed(self, p: v.FillProblem, pattern: npt.NDArray[Any]) -> bool:
        """A large fill by whole 64-byte lines streamed past the caches; False where it cannot."""
        compiled = kernels("_kmove")
        out = self._flat(p.region, pattern.dtype)[: p.count]
        phase = -1 if compiled is None else compiled.line_phase(out)
        if phase < 0:
            return False
        per_line = 64 // out.dtype.itemsize
        lines = (p.count - phase) // per_line
        body = out[phase : phase + lines * per_line].view(np.uint32)
        line = np.ascontiguousarray(np.broadcast_to(pattern, per_line)).view(np.uint32)
        out[:phase] = pattern
        out[phase + lines * per_line :] = pattern
        parallel_ranges(lines, lambda start, stop: compiled.fill_lines(line, body, start, stop), grain=1024)
        return True

    def _exec_copy_strided(self, p: v.StridedProblem) -> None:
        bits = _BITS[p.dtype.itemsize]
        layout = simplify(p.shape, (p.src_strides, p.dst_strides))
        copy_layout(self._flat(p.src, bits), p.src_origin, self._flat(p.dst, bits), p.dst_origin, layout)

    # ------------------------------------------------------------------ gather / scatter

    def _indices(self, p: v.RowsProblem) -> npt.NDArray[Any]:
        """The problem's indices: the validated host copy, or a checked private copy of device ones."""
        if p.indices is not None:
            return p.indices
        assert p.index is not None and p.index_dtype is not None
        # Copied first, then checked and used: another thread may write the device indices.
        indices = self._flat(p.index, p.index_dtype)[: p.count].copy()
        if indices.size:
            low, high = int(indices.min()), int(indices.max())
            if low < 0:
                raise InvalidArgumentError(f"index {low} is negative")
            if high >= p.rows:
                raise InvalidArgumentError(f"index {high} is out of range for {p.rows} rows")
        return indices

    def _exec_gather(self, p: v.RowsProblem) -> None:
        indices = self._indices(p)
        if p.cols == 0 or indices.size == 0:
            return
        bits = _BITS[p.dtype.itemsize]
        table = self._array(p.input, (p.rows, p.cols), bits)
        out = self._array(p.output, (indices.size, p.cols), bits)

        def run(start: int, stop: int) -> None:
            # The indices were checked; mode="clip" lets take() write straight into
            # `out` (mode="raise" buffers the whole result and copies it again).
            np.take(table, indices[start:stop], axis=0, out=out[start:stop], mode="clip")

        parallel_ranges(indices.size, run, grain=max(1, PARALLEL_THRESHOLD // p.cols))

    def _exec_scatter(self, p: v.RowsProblem) -> None:
        indices = self._indices(p)
        if indices.size == 0 or p.cols == 0:
            return
        bits = _BITS[p.dtype.itemsize]
        src = self._array(p.input, (indices.size, p.cols), bits)
        out = self._array(p.output, (p.rows, p.cols), bits)
        destinations, sources = v.last_occurrences(indices.astype(np.int64, copy=False))
        grain = max(1, PARALLEL_THRESHOLD // p.cols)
        if destinations.size == indices.size:
            # Distinct rows: every source row lands once, in any order.
            def run_distinct(start: int, stop: int) -> None:
                out[indices[start:stop]] = src[start:stop]

            parallel_ranges(indices.size, run_distinct, grain=grain)
            return
        chunk = max(1, min(256, (1 << 16) // p.cols))

        def run(start: int, stop: int) -> None:
            buffer = np.empty((min(chunk, stop - start), p.cols), dtype=bits)
            for lo in range(start, stop, chunk):
                hi = min(stop, lo + chunk)
                rows = buffer[: hi - lo]
                np.take(src, sources[lo:hi], axis=0, out=rows, mode="clip")
                out[destinations[lo:hi]] = rows

        parallel_ranges(destinations.size, run, grain=grain)

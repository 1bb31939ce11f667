"""Reductions and softmax along one axis of a row-major tensor, viewed as [outer, length, inner].

Both split over the worker threads; softmax works on cache-sized blocks so that each
of its passes hits L2 and memory sees one read and one write per element. float32
uses the fused compiled kernels of :mod:`._kmath` where numba works.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import validation as v
from ...types import ReduceOp
from ._plumbing import CpuPlumbing, FloatArray
from ._runtime import PARALLEL_THRESHOLD, kernels, parallel_ranges, workers
from ._softmax_fast import fast_softmax

__all__ = ["AxisOps", "AXIS_BLOCK", "KERNEL_THRESHOLD"]

#: Elements per block of a blocked axis operation (256 KiB of float32: half of L2).
AXIS_BLOCK = 1 << 16
#: Problems below this many elements stay on NumPy (no kernel dispatch).
KERNEL_THRESHOLD = 1 << 12


def axis_blocks(outer: int, length: int, inner: int) -> tuple[list[tuple[int, int, int, int]], int]:
    """Split an [outer, length, inner] axis problem into cache-sized blocks.

    Returns ``(blocks, elements_per_block)`` with blocks ``(o0, o1, i0, i1)``; each block
    keeps whole slices along the axis. Kept-axis panels are at least 64 wide so the
    strided passes still run long inner loops.
    """
    length = max(1, length)
    width = inner if inner * length <= AXIS_BLOCK else min(inner, max(64, AXIS_BLOCK // length))
    rows = max(1, AXIS_BLOCK // (length * width))
    blocks = [
        (o0, min(outer, o0 + rows), i0, min(inner, i0 + width))
        for o0 in range(0, outer, rows)
        for i0 in range(0, inner, width)
    ]
    return blocks, min(outer, rows) * length * width


def _compiled(p: v.AxisProblem, size: int) -> Any:
    """The float32 kernel module when it applies to ``p`` (``size`` elements), else None."""
    if p.dtype != np.float32 or size < KERNEL_THRESHOLD:
        return None
    return kernels("_kmath")


def _softmax_columns(x: FloatArray, out: FloatArray, log: bool) -> None:
    """(Log-)softmax down the columns (axis 0) of a [length, width] row-major panel.

    Three passes of contiguous rows: the column maxima, then ``exp(x - max)`` block by
    block (each block summed while it is in cache), then the division (or, for
    log-softmax, the subtraction of the sums' logarithms). ``out`` does not overlap ``x``.
    """
    length, width = x.shape
    peak = np.fmax.reduce(x, axis=0, initial=-np.inf)
    total = np.zeros(width, dtype=x.dtype)
    rows = max(1, AXIS_BLOCK // width)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for r0 in range(0, length, rows):
            block = out[r0 : r0 + rows]
            np.subtract(x[r0 : r0 + rows], peak, out=block)
            total += np.add.reduce(np.exp(block) if log else np.exp(block, out=block), axis=0)
        if log:
            np.log(total, out=total)
        for r0 in range(0, length, rows):
            block = out[r0 : r0 + rows]
            (np.subtract if log else np.divide)(block, total, out=block)


def _softmax_slices(x: FloatArray, out: FloatArray, log: bool) -> None:
    """(Log-)softmax over axis 1 of [outer, length, inner] views; ``out`` does not overlap ``x``."""
    peak = np.fmax.reduce(x, axis=1, initial=-np.inf, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        np.subtract(x, peak, out=out)
        if log:
            total = np.add.reduce(np.exp(out), axis=1, keepdims=True)
            np.subtract(out, np.log(total, out=total), out=out)
            return
        np.exp(out, out=out)
        total = np.add.reduce(out, axis=1, keepdims=True)
        np.divide(out, total, out=out)


class AxisOps(CpuPlumbing):
    """``reduce`` and ``softmax`` (and log-softmax)."""

    def _exec_reduce(self, p: v.AxisProblem) -> None:
        dt = p.dtype
        out = self._array(p.output, (p.outer, p.inner), dt)
        x = self._array(p.input, (p.outer, p.length, p.inner), dt)
        compiled = _compiled(p, x.size)
        if compiled is not None and p.inner >= 64:
            self._reduce_columns(compiled, p, x, out)
            return
        if compiled is not None and p.inner == 1 and p.op in (ReduceOp.SUM, ReduceOp.MEAN):
            rows = x.reshape(p.outer, p.length)
            flat = out.reshape(p.outer)

            def run_sums(start: int, stop: int) -> None:
                compiled.sum_rows(rows[start:stop], flat[start:stop])
                if p.op is ReduceOp.MEAN:
                    np.divide(flat[start:stop], dt.type(p.length), out=flat[start:stop])

            parallel_ranges(p.outer, run_sums, grain=max(1, PARALLEL_THRESHOLD // p.length))
            return

        def run(start: int, stop: int) -> None:
            self._reduce_rows(p, x[start:stop], out[start:stop])

        if p.outer > 1:
            parallel_ranges(p.outer, run, grain=max(1, PARALLEL_THRESHOLD // max(1, p.length * p.inner)))
            return

        # One outer slice: split the kept (inner) axis instead.
        def run_inner(start: int, stop: int) -> None:
            self._reduce_rows(p, x[:, :, start:stop], out[:, start:stop])

        parallel_ranges(p.inner, run_inner, grain=max(1, PARALLEL_THRESHOLD // max(1, p.length)))

    @staticmethod
    def _reduce_columns(compiled: Any, p: v.AxisProblem, x: FloatArray, out: FloatArray) -> None:
        """Reduce a strided axis: each thread streams whole contiguous rows (a share of the
        reduced axis) into its own accumulator row; the few partial rows are then folded
        together (NumPy's reductions along a strided axis run below bandwidth)."""
        parts = max(1, min(workers(), p.length))
        partial = np.empty((p.outer, parts, p.inner), dtype=p.dtype)
        cuts = [p.length * i // parts for i in range(parts + 1)]
        largest = p.op is ReduceOp.MAX

        def run_parts(start: int, stop: int) -> None:
            for t in range(start, stop):
                o, i = divmod(t, parts)
                rows = x[o, cuts[i] : cuts[i + 1]]
                if p.op in (ReduceOp.MAX, ReduceOp.MIN):
                    compiled.extreme_columns(rows, partial[o, i], 0, p.inner, largest)
                else:
                    compiled.sum_columns(rows, partial[o, i])

        parallel_ranges(p.outer * parts, run_parts, grain=1)
        with np.errstate(invalid="ignore", over="ignore"):
            if p.op in (ReduceOp.MAX, ReduceOp.MIN):
                (np.fmax if largest else np.fmin).reduce(partial, axis=1, out=out)
                return
            np.add.reduce(partial, axis=1, out=out)
            if p.op is ReduceOp.MEAN:
                np.divide(out, out.dtype.type(p.length), out=out)

    @staticmethod
    def _reduce_rows(p: v.AxisProblem, x: FloatArray, out: FloatArray) -> None:
        if p.op is ReduceOp.MAX:
            np.fmax.reduce(x, axis=1, initial=-np.inf, out=out)
        elif p.op is ReduceOp.MIN:
            np.fmin.reduce(x, axis=1, initial=np.inf, out=out)
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                np.add.reduce(x, axis=1, out=out)
                if p.op is ReduceOp.MEAN:
                    np.divide(out, out.dtype.type(p.length), out=out)

    def _exec_softmax(self, p: v.AxisProblem) -> None:
        dt = p.dtype
        x = self._array(p.input, (p.outer, p.length, p.inner), dt)
        out = self._array(p.output, (p.outer, p.length, p.inner), dt)
        if fast_softmax(p, x, out):
            return
        compiled = _compiled(p, x.size)
        if compiled is not None:
            self._softmax_compiled(compiled, p, x, out)
            return
        if p.inner == 1 or p.length * p.inner <= AXIS_BLOCK:
            # Cache-sized blocks of whole slices: every pass of _softmax_slices over a
            # block hits L2, so memory sees one read and one write per element.
            blocks, per_block = axis_blocks(p.outer, p.length, p.inner)

            def run(start: int, stop: int) -> None:
                for o0, o1, i0, i1 in blocks[start:stop]:
                    _softmax_slices(x[o0:o1, :, i0:i1], out[o0:o1, :, i0:i1], p.log)

            parallel_ranges(len(blocks), run, grain=max(1, PARALLEL_THRESHOLD // per_block))
            return
        # The axis is strided (inner > 1): stream contiguous rows instead, in panels of
        # columns, one panel per thread (see _softmax_columns).
        width = max(256, -(-p.inner // workers()))
        panels = [
            (o, i0, min(p.inner, i0 + width)) for o in range(p.outer) for i0 in range(0, p.inner, width)
        ]

        def run_panels(start: int, stop: int) -> None:
            for o, i0, i1 in panels[start:stop]:
                _softmax_columns(x[o, :, i0:i1], out[o, :, i0:i1], p.log)

        parallel_ranges(len(panels), run_panels, grain=max(1, PARALLEL_THRESHOLD // (p.length * width)))

    @staticmethod
    def _softmax_compiled(compiled: Any, p: v.AxisProblem, x: FloatArray, out: FloatArray) -> None:
        """Softmax with the compiled fused kernels (``out`` is ``x`` or does not overlap it)."""
        if p.inner == 1:
            rows_x = x.reshape(p.outer, p.length)
            rows_out = out.reshape(p.outer, p.length)

            def run_rows(start: int, stop: int) -> None:
                (compiled.log_softmax_rows if p.log else compiled.softmax_rows)(
                    rows_x[start:stop], rows_out[start:stop]
                )

            parallel_ranges(p.outer, run_rows, grain=max(1, PARALLEL_THRESHOLD // p.length))
            return
        # Strided axis: each thread takes whole column ranges of an outer slice (see
        # softmax_columns); wide ranges keep the inner loops long.
        width = max(64, -(-p.inner // workers()))
        panels = [
            (o, c0, min(p.inner, c0 + width)) for o in range(p.outer) for c0 in range(0, p.inner, width)
        ]

        def run_panels(start: int, stop: int) -> None:
            for o, c0, c1 in panels[start:stop]:
                (compiled.log_softmax_columns if p.log else compiled.softmax_columns)(x[o], out[o], c0, c1)

        parallel_ranges(len(panels), run_panels, grain=max(1, PARALLEL_THRESHOLD // (p.length * width)))

"""Operations along an axis on OpenCL: reductions, (log-)softmax (``kernels/reduce.cl``) and
normalisation (``kernels/norm.cl``), in float32 and float64.

A tensor is viewed as [outer, length, inner]. With ``inner == 1`` one work-group folds
each row (long rows split across several groups, then their partials reduced); otherwise
one work-item folds each (outer, inner) column. Layer and RMS normalisation fold a row per
work-group; batch normalisation and LRN map elements of [N, C, spatial].
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import validation as v
from ...types import ReduceOp
from .._common import REDUCE_CODES, ceil_div
from ._core import OpenCLCore
from ._runtime import Operand

__all__ = ["AxisOps"]

I32 = np.int32
I64 = np.int64
_NORM_RMS, _NORM_SCALE, _NORM_BIAS = 1, 2, 4


class AxisOps(OpenCLCore):
    """reduce, softmax, layer_norm, rms_norm, batch_norm and lrn."""

    def _fold_kernel(self, source: str, name: str, dtype: np.dtype[Any], ls: int) -> Any:
        if not self._contig:
            return self._kernel(source, name, dtype, LS=ls, CONTIG=0)
        lanes = self._lanes(dtype)  # the column blocks' and the exp sums' vectors (reduce.cl)
        return self._kernel(source, name, dtype, LS=ls, CONTIG=1, CW=lanes, VW=min(8, lanes))

    def _cols_kernel(self, name: str, p: v.AxisProblem) -> tuple[Any, int]:
        """The column kernel ``name`` and its work-item count: on the CPU profile one work-item
        per block of neighbouring columns, a vector's lanes wide (``<name>v``), else one per column."""
        lanes = self._lanes(p.dtype)
        if self._contig and p.inner >= lanes:
            name, count = name + "v", p.outer * ceil_div(p.inner, lanes)
        else:
            count = p.outer * p.inner
        return self._fold_kernel("reduce.cl", name, p.dtype, self._reduce_ls), count

    def _exec_reduce(self, p: v.AxisProblem) -> None:
        assert p.op is not None
        size = p.dtype.itemsize
        x, y = self._at(p.input, size), self._at(p.output, size)
        code = I32(REDUCE_CODES[p.op])
        with self._lock:
            if p.inner > 1:
                kernel, count = self._cols_kernel("reduce_cols", p)
                self._launch(
                    kernel, (count,), (min(16, self._max_wg),),
                    x.buffer, I64(x.offset), y.buffer, I64(y.offset),
                    I64(p.outer), I64(p.length), I64(p.inner), code,
                )  # fmt: skip
                return
            ls = self._rows_ls(p.length)
            kernel = self._fold_kernel("reduce.cl", "reduce_rows_split", p.dtype, ls)
            # Few long rows: split each across work-groups, then reduce the partials.
            parts = 1
            if p.outer < 4 * self._compute_units and p.length >= 64 * ls:
                parts = min(p.length // (16 * ls), ceil_div(16 * self._compute_units, p.outer))
            length = p.length
            if parts > 1:
                partial = self._scratch_buffer("partials", p.outer * parts * size)
                first = I32(REDUCE_CODES[ReduceOp.SUM if p.op is ReduceOp.MEAN else p.op])
                self._launch(
                    kernel, (p.outer * parts * ls,), (ls,),
                    x.buffer, I64(x.offset), partial, I64(0), I64(p.length), first, I64(parts), I64(0),
                )  # fmt: skip
                x, length = Operand(partial, 0), parts
            self._launch(
                kernel, (p.outer * ls,), (ls,),
                x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(length), code, I64(1), I64(p.length),
            )  # fmt: skip

    def _exec_softmax(self, p: v.AxisProblem) -> None:
        size = p.dtype.itemsize
        x, y = self._at(p.input, size), self._at(p.output, size)
        log = I32(int(p.log))
        with self._lock:
            if p.inner == 1:
                ls = self._rows_ls(p.length)
                kernel = self._fold_kernel("reduce.cl", "softmax_rows", p.dtype, ls)
                self._launch(
                    kernel, (p.outer * ls,), (ls,),
                    x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(p.length), log,
                )  # fmt: skip
                return
            kernel, count = self._cols_kernel("softmax_cols", p)
            self._launch(
                kernel, (count,), (min(16, self._max_wg),),
                x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(p.outer), I64(p.length), I64(p.inner),
                log,
            )  # fmt: skip

    def _norm(self, p: v.NormProblem) -> None:
        size, real = p.dtype.itemsize, p.dtype.type
        x, y = self._at(p.input, size), self._at(p.output, size)
        scale = self._at(p.scale, size) if p.scale is not None else Operand(None, 0)
        bias = self._at(p.bias, size) if p.bias is not None else Operand(None, 0)
        flags = _NORM_RMS if p.rms else 0
        flags |= (_NORM_SCALE if p.scale is not None else 0) | (_NORM_BIAS if p.bias is not None else 0)
        ls = self._rows_ls(p.cols)
        with self._lock:
            kernel = self._fold_kernel("norm.cl", "norm_rows", p.dtype, ls)
            self._launch(
                kernel, (p.rows * ls,), (ls,),
                x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(p.cols), real(p.eps),
                scale.buffer, I64(scale.offset), bias.buffer, I64(bias.offset), I32(flags),
            )  # fmt: skip

    def _exec_layer_norm(self, p: v.NormProblem) -> None:
        self._norm(p)

    def _exec_rms_norm(self, p: v.NormProblem) -> None:
        self._norm(p)

    def _exec_batch_norm(self, p: v.BatchNormProblem) -> None:
        size, run = p.dtype.itemsize, self._run()
        x, y = self._at(p.input, size), self._at(p.output, size)
        s, b, m, var = (self._at(r, size) for r in (p.scale, p.bias, p.mean, p.var))
        with self._lock:
            kernel = self._kernel("norm.cl", "batch_norm", p.dtype)
            self._launch(
                kernel, (ceil_div(p.spatial, run), p.n * p.c), self._strided_local(),
                x.buffer, I64(x.offset), y.buffer, I64(y.offset), s.buffer, I64(s.offset),
                b.buffer, I64(b.offset), m.buffer, I64(m.offset), var.buffer, I64(var.offset),
                I64(p.c), I64(p.spatial), I64(run), p.dtype.type(p.eps),
            )  # fmt: skip

    def _exec_lrn(self, p: v.LrnProblem) -> None:
        size, run, real = p.dtype.itemsize, self._run(), p.dtype.type
        x, y = self._at(p.input, size), self._at(p.output, size)
        with self._lock:
            kernel = self._kernel("norm.cl", "lrn", p.dtype)
            self._launch(
                kernel, (ceil_div(p.spatial, run), p.n * p.c), self._strided_local(),
                x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(p.c), I64(p.spatial), I64(run),
                I64(p.size), real(p.alpha), real(p.beta), real(p.bias),
            )  # fmt: skip

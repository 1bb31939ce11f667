"""Operations along an axis on OpenCL: reductions and softmax (``kernels/reduce.cl``).

A tensor is viewed as [outer, length, inner]. With ``inner == 1`` one work-group folds
each row (long rows split across several groups, then their partials reduced); otherwise
one work-item folds each (outer, inner) column.
"""

from __future__ import annotations

import numpy as np

from ... import validation as v
from ...types import ReduceOp
from .._common import REDUCE_CODES, ceil_div, refuse_extensions
from ._core import OpenCLCore
from ._runtime import Operand

__all__ = ["AxisOps"]

I32 = np.int32
I64 = np.int64


class AxisOps(OpenCLCore):
    """reduce and softmax."""

    def _exec_reduce(self, p: v.AxisProblem) -> None:
        assert p.op is not None
        x, y = self._at(p.input), self._at(p.output)
        code = I32(REDUCE_CODES[p.op])
        with self._lock:
            if p.inner > 1:
                kernel = self._kernel("reduce.cl", "reduce_cols", LS=self._reduce_ls, CONTIG=self._contig)
                self._launch(
                    kernel, (p.outer * p.inner,), (min(64, self._max_wg),),
                    x.buffer, I64(x.offset), y.buffer, I64(y.offset),
                    I64(p.outer), I64(p.length), I64(p.inner), code,
                )  # fmt: skip
                return
            ls = self._rows_ls(p.length)
            kernel = self._kernel("reduce.cl", "reduce_rows_split", LS=ls, CONTIG=self._contig)
            # Few long rows: split each across work-groups, then reduce the partials.
            parts = 1
            if p.outer < 4 * self._compute_units and p.length >= 64 * ls:
                parts = min(p.length // (16 * ls), ceil_div(16 * self._compute_units, p.outer))
            length = p.length
            if parts > 1:
                partial = self._scratch_buffer("partials", p.outer * parts * 4)
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
        refuse_extensions("opencl", "softmax", p)
        x, y = self._at(p.input), self._at(p.output)
        with self._lock:
            if p.inner == 1:
                ls = self._rows_ls(p.length)
                kernel = self._kernel("reduce.cl", "softmax_rows", LS=ls, CONTIG=self._contig)
                self._launch(
                    kernel, (p.outer * ls,), (ls,),
                    x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(p.length),
                )  # fmt: skip
                return
            kernel = self._kernel("reduce.cl", "softmax_cols", LS=self._reduce_ls, CONTIG=self._contig)
            self._launch(
                kernel, (p.outer * p.inner,), (min(64, self._max_wg),),
                x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(p.outer), I64(p.length), I64(p.inner),
            )  # fmt: skip

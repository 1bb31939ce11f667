"""Operations along an axis on CUDA: reductions and softmax (``kernels/reduce.cl``).

A tensor is viewed as [outer, length, inner]. With ``inner == 1`` one block of
``REDUCE_LS`` threads folds each row; otherwise one thread folds each (outer, inner)
column (neighbouring threads read neighbouring addresses).
"""

from __future__ import annotations

from ... import validation as v
from .._common import REDUCE_CODES, refuse_extensions
from ._core import I32, I64, CudaCore, Ptr, linear
from ._programs import REDUCE_LS, real_of, reduce_unit

__all__ = ["AxisOps"]

#: Threads per block of the column kernels.
_COLS_BLOCK = 128


class AxisOps(CudaCore):
    """reduce and softmax."""

    def _exec_reduce(self, p: v.AxisProblem) -> None:
        assert p.op is not None
        unit, code = reduce_unit(real_of(p.dtype.name)), I32(REDUCE_CODES[p.op])
        x, y = Ptr(p.input.ptr), Ptr(p.output.ptr)
        if p.inner == 1:
            self._launch(
                unit, "reduce_rows", (p.outer,), (REDUCE_LS,), x, I64(0), y, I64(0), I64(p.length), code
            )
            return
        grid, block = linear(p.outer * p.inner, _COLS_BLOCK)
        self._launch(
            unit,
            "reduce_cols",
            grid,
            block,
            x,
            I64(0),
            y,
            I64(0),
            I64(p.outer),
            I64(p.length),
            I64(p.inner),
            code,
        )

    def _exec_softmax(self, p: v.AxisProblem) -> None:
        refuse_extensions("cuda", "softmax", p)
        unit = reduce_unit(real_of(p.dtype.name))
        x, y = Ptr(p.input.ptr), Ptr(p.output.ptr)
        if p.inner == 1:
            self._launch(unit, "softmax_rows", (p.outer,), (REDUCE_LS,), x, I64(0), y, I64(0), I64(p.length))
            return
        grid, block = linear(p.outer * p.inner, _COLS_BLOCK)
        self._launch(
            unit, "softmax_cols", grid, block, x, I64(0), y, I64(0), I64(p.outer), I64(p.length), I64(p.inner)
        )

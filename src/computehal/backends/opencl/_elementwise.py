"""Element-wise operations on OpenCL: unary and binary maps (``kernels/elementwise.cl``).

One work-item handles EW consecutive elements (16 on the CPU profile, where the fixed
inner loop becomes vector code; 1 on the GPU profile). An input may be the very same
range as the output: each element is read before it is written by the same work-item.
"""

from __future__ import annotations

import numpy as np

from ... import validation as v
from ...types import BinaryOp, UnaryOp
from .._common import ceil_div
from ._core import OpenCLCore

__all__ = ["ElementwiseOps"]

I64 = np.int64


class ElementwiseOps(OpenCLCore):
    """unary and binary."""

    def _elementwise_local(self, n: int) -> int:
        return min(1024 if n >= (1 << 18) else 16, self._max_wg)

    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        assert isinstance(p.op, UnaryOp)
        x, y = self._at(p.a), self._at(p.out)
        with self._lock:
            kernel = self._kernel("elementwise.cl", f"unary_{p.op.value}", EW=self._ew)
            self._launch(
                kernel, (ceil_div(p.n, self._ew),), (self._elementwise_local(p.n),),
                x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(p.n),
            )  # fmt: skip

    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        assert isinstance(p.op, BinaryOp) and p.b is not None
        a, b, y = self._at(p.a), self._at(p.b), self._at(p.out)
        with self._lock:
            kernel = self._kernel("elementwise.cl", f"binary_{p.op.value}", EW=self._ew)
            self._launch(
                kernel, (ceil_div(p.n, self._ew),), (self._elementwise_local(p.n),),
                a.buffer, I64(a.offset), b.buffer, I64(b.offset), y.buffer, I64(y.offset), I64(p.n),
            )  # fmt: skip

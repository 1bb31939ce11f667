"""Element-wise operations on OpenCL: unary, binary and broadcasting binary maps
(``kernels/elementwise.cl``) and dtype conversion (``kernels/cast.cl``).

One work-item handles EW consecutive elements (16 on the CPU profile, where the fixed
inner loop becomes vector code; 1 on the GPU profile). An input may be the very same
range as the output: each element is read before it is written by the same work-item.
Each op has a kernel of its own, named by the op's value (``unary_gelu``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import validation as v
from ...dtypes import F64
from ...errors import UnsupportedError
from ...types import BinaryOp, UnaryOp
from .._common import ceil_div, collapse
from ._core import OpenCLCore
from ._runtime import outer_args

__all__ = ["ElementwiseOps", "SHORT_NAMES"]

I64 = np.int64

#: Kernel-name spelling of each storage dtype.
SHORT_NAMES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


class ElementwiseOps(OpenCLCore):
    """unary, binary, broadcast_binary and cast."""

    def _elementwise_local(self, n: int) -> int:
        return min(1024 if n >= (1 << 18) else 16, self._max_wg)

    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        assert isinstance(p.op, UnaryOp)
        size, real = p.dtype.itemsize, p.dtype.type
        x, y = self._at(p.a, size), self._at(p.out, size)
        with self._lock:
            name = f"unary_{p.op.value}"
            kernel = self._kernel("elementwise.cl", name, p.dtype, **self._ew_defines(p.dtype))
            self._launch(
                kernel, (ceil_div(p.n, self._ew),), (self._elementwise_local(p.n),),
                x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(p.n),
                real(p.alpha), real(p.lo), real(p.hi),
            )  # fmt: skip

    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        assert isinstance(p.op, BinaryOp) and p.b is not None
        size = p.dtype.itemsize
        a, b, y = self._at(p.a, size), self._at(p.b, size), self._at(p.out, size)
        with self._lock:
            name = f"binary_{p.op.value}"
            kernel = self._kernel("elementwise.cl", name, p.dtype, **self._ew_defines(p.dtype))
            self._launch(
                kernel, (ceil_div(p.n, self._ew),), (self._elementwise_local(p.n),),
                a.buffer, I64(a.offset), b.buffer, I64(b.offset),
                y.buffer, I64(y.offset), I64(p.n),
            )  # fmt: skip

    def _exec_broadcast_binary(self, p: v.BroadcastProblem) -> None:
        size = p.dtype.itemsize
        a, b, y = self._at(p.a, size), self._at(p.b, size), self._at(p.out, size)
        dims, (_, sa, sb) = collapse(p.shape, p.out_strides, p.a_strides, p.b_strides)
        inner, run = dims[-1], self._run()
        outer = p.size // inner
        with self._lock:
            name = f"broadcast_{p.op.value}"
            kernel = self._kernel("elementwise.cl", name, p.dtype, **self._ew_defines(p.dtype))
            self._launch(
                kernel, (ceil_div(inner, run), outer), self._strided_local(),
                a.buffer, I64(a.offset), b.buffer, I64(b.offset),
                y.buffer, I64(y.offset), I64(inner), I64(run), I64(sa[-1]), I64(sb[-1]),
                *outer_args(dims, sa, sb),
            )  # fmt: skip

    def _exec_cast(self, p: v.CastProblem) -> None:
        wide = F64 in (p.dtype, p.out_dtype)
        if wide and not self._fp64():
            note = self._dtype_note("float64")
            raise UnsupportedError(f"cast to or from float64 on the {self.name()} backend{note}")
        x, y = self._at(p.input, p.dtype.itemsize), self._at(p.output, p.out_dtype.itemsize)
        name = f"cast_{SHORT_NAMES[p.dtype.name]}_{SHORT_NAMES[p.out_dtype.name]}"
        defines: dict[str, Any] = {"EW": self._ew, "USE_FP64": 1} if wide else {"EW": self._ew}
        with self._lock:
            kernel = self._kernel("cast.cl", name, **defines)
            self._launch(
                kernel, (ceil_div(p.n, self._ew),), (self._elementwise_local(p.n),),
                x.buffer, I64(x.offset), y.buffer, I64(y.offset), I64(p.n),
            )  # fmt: skip

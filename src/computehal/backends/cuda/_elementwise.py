"""Element-wise operations on CUDA: unary, binary and broadcasting maps
(``kernels/elementwise.cl``) and dtype conversion (``kernels/cast.cl``).

One thread per element; each op has a kernel of its own, named by the op's value
(``unary_gelu``), in a float and a double build. An input may be the very same range as
the output (each element is read before it is written by the same thread). Broadcasting
collapses the view to an inner dimension walked by grid x and up to five outer ones
indexed by grid y (split into pieces when there are more than CUDA's 65535).
"""

from __future__ import annotations

import math

from ... import validation as v
from ...types import BinaryOp, UnaryOp
from .._common import ceil_div, collapse, strided_outer
from ._core import I64, CudaCore, Ptr, linear, scalar, split_outer
from ._programs import elementwise_unit, real_of

__all__ = ["ElementwiseOps", "SHORT_NAMES"]

#: Kernel-name spelling of each storage dtype.
SHORT_NAMES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


def _row_block(inner: int) -> int:
    """Threads per block along the inner dimension of a strided kernel (a multiple of 32)."""
    return min(256, ceil_div(inner, 32) * 32)


class ElementwiseOps(CudaCore):
    """unary, binary, broadcast_binary and cast."""

    def _exec_unary(self, p: v.ElementwiseProblem) -> None:
        assert isinstance(p.op, UnaryOp)
        grid, block = linear(p.n)
        self._launch(
            elementwise_unit(real_of(p.dtype.name)), f"unary_{p.op.value}", grid, block,
            Ptr(p.a.ptr), I64(0), Ptr(p.out.ptr), I64(0), I64(p.n),
            *(scalar(x, p.dtype) for x in (p.alpha, p.lo, p.hi)),
        )  # fmt: skip

    def _exec_binary(self, p: v.ElementwiseProblem) -> None:
        assert isinstance(p.op, BinaryOp) and p.b is not None
        grid, block = linear(p.n)
        self._launch(
            elementwise_unit(real_of(p.dtype.name)), f"binary_{p.op.value}", grid, block,
            Ptr(p.a.ptr), I64(0), Ptr(p.b.ptr), I64(0), Ptr(p.out.ptr), I64(0), I64(p.n),
        )  # fmt: skip

    def _exec_broadcast_binary(self, p: v.BroadcastProblem) -> None:
        dims, sets = collapse(p.shape, p.a_strides, p.b_strides, p.out_strides)
        inner = dims[-1]
        sa, sb = sets[0], sets[1]
        unit, name = elementwise_unit(real_of(p.dtype.name)), f"broadcast_{p.op.value}"
        block = _row_block(inner)
        for piece, (oa, ob, oy) in split_outer(dims, sets):
            self._launch(
                unit, name, (ceil_div(inner, block), math.prod(piece[:-1])), (block, 1),
                Ptr(p.a.ptr), I64(oa), Ptr(p.b.ptr), I64(ob), Ptr(p.out.ptr), I64(oy),
                I64(inner), I64(1), I64(sa[-1]), I64(sb[-1]),
                *(I64(x) for x in strided_outer(piece, sa, sb)),
            )  # fmt: skip

    def _exec_cast(self, p: v.CastProblem) -> None:
        name = f"cast_{SHORT_NAMES[p.dtype.name]}_{SHORT_NAMES[p.out_dtype.name]}"
        self._cast_bits(name, p.input.ptr, p.output.ptr, p.n)

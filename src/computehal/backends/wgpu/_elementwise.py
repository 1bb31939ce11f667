"""Element-wise operations (wgpu_elementwise*.wgsl): unary and binary ops over float32.

Where every operand's element offset is a multiple of 4, four floats per invocation
run through vec4 views of the same bindings and the tail of ``n % 4`` elements through
the scalar kernels. An output may be the very same range as an input (in place).
"""

from __future__ import annotations

from ... import validation as v
from ...types import BinaryOp, UnaryOp
from .._common import BINARY_CODES, UNARY_CODES, refuse_extensions
from ._device import Gpu
from ._queue import Binding, Step, grid_1d, pack

__all__ = ["binary", "unary"]


def _elementwise(gpu: Gpu, p: v.ElementwiseProblem, kernel: str, code: int) -> None:
    ba = gpu.bind("a_ptr" if p.b is not None else "input_ptr", p.a)
    bb = ba if p.b is None else gpu.bind("b_ptr", p.b)
    bo = gpu.bind("output_ptr", p.out)
    steps = []
    done = 0
    if p.n >= 4 and ba.elem % 4 == 0 and bb.elem % 4 == 0 and bo.elem % 4 == 0:
        vectors = p.n // 4
        done = 4 * vectors
        views = tuple(
            Binding(b.buffer, b.offset, b.size - b.size % 16, b.byte, b.cached) for b in (ba, bb, bo)
        )
        params = pack(vectors, ba.elem // 4, bb.elem // 4, bo.elem // 4, code)
        steps.append(Step(kernel + "4", params, views, grid_1d(vectors, 256)))
    if done < p.n:
        rest = p.n - done
        params = pack(rest, ba.elem + done, bb.elem + done, bo.elem + done, code)
        steps.append(Step(kernel, params, (ba, bb, bo), grid_1d(rest, 256)))
    gpu.run(steps)


def unary(gpu: Gpu, p: v.ElementwiseProblem) -> None:
    """Run a validated unary op."""
    refuse_extensions("wgpu", "unary", p)
    assert isinstance(p.op, UnaryOp)
    _elementwise(gpu, p, "unary", UNARY_CODES[p.op])


def binary(gpu: Gpu, p: v.ElementwiseProblem) -> None:
    """Run a validated binary op."""
    refuse_extensions("wgpu", "binary", p)
    assert isinstance(p.op, BinaryOp)
    _elementwise(gpu, p, "binary", BINARY_CODES[p.op])

"""Element-wise operations: unary, binary, broadcasting binary and dtype conversion.

Unary and binary ops (wgpu_elementwise*.wgsl, functions in wgpu_elementwise_ops.wgsl
and wgpu_math.wgsl): where every operand's element offset is a multiple of 4, four
floats per invocation run through vec4 views of the same bindings and the tail of
``n % 4`` elements through the scalar kernels. An output may be the very same range as
an input (in place). ``broadcast_binary`` (wgpu_broadcast.wgsl) walks the output with
the inputs' broadcast strides after merging dimensions. ``cast`` (wgpu_cast.wgsl)
converts on bit patterns, each invocation owning one output word; it is also what the
shared base uses to run every op on float16 / bfloat16 storage.
"""

from __future__ import annotations

from ... import validation as v
from ...errors import UnsupportedError
from ...types import BinaryOp, UnaryOp
from .._common import BINARY_CODES, UNARY_CODES, ceil_div, collapse
from ._device import Gpu
from ._movement import copy_range
from ._queue import Binding, Step, grid_1d, pack, vec6

__all__ = ["binary", "broadcast_binary", "cast", "unary"]

#: Element kinds of wgpu_cast.wgsl.
_KINDS = {"float16": 0, "bfloat16": 1, "float32": 2}


def _elementwise(gpu: Gpu, p: v.ElementwiseProblem, kernel: str, code: int) -> None:
    ba = gpu.bind("a_ptr" if p.b is not None else "input_ptr", p.a)
    bb = ba if p.b is None else gpu.bind("b_ptr", p.b)
    bo = gpu.bind("output_ptr", p.out)
    extra = (float(p.alpha), float(p.lo), float(p.hi))
    steps = []
    done = 0
    if p.n >= 4 and ba.elem % 4 == 0 and bb.elem % 4 == 0 and bo.elem % 4 == 0:
        vectors = p.n // 4
        done = 4 * vectors
        views = tuple(
            Binding(b.buffer, b.offset, b.size - b.size % 16, b.byte, b.cached) for b in (ba, bb, bo)
        )
        params = pack(vectors, ba.elem // 4, bb.elem // 4, bo.elem // 4, code, *extra)
        steps.append(Step(kernel + "4", params, views, grid_1d(vectors, 256)))
    if done < p.n:
        rest = p.n - done
        params = pack(rest, ba.elem + done, bb.elem + done, bo.elem + done, code, *extra)
        steps.append(Step(kernel, params, (ba, bb, bo), grid_1d(rest, 256)))
    gpu.run(steps)


def unary(gpu: Gpu, p: v.ElementwiseProblem) -> None:
    """Run a validated unary op."""
    assert isinstance(p.op, UnaryOp)
    _elementwise(gpu, p, "unary", UNARY_CODES[p.op])


def binary(gpu: Gpu, p: v.ElementwiseProblem) -> None:
    """Run a validated binary op."""
    assert isinstance(p.op, BinaryOp)
    _elementwise(gpu, p, "binary", BINARY_CODES[p.op])


def broadcast_binary(gpu: Gpu, p: v.BroadcastProblem) -> None:
    """Run a validated broadcasting binary op (the output is contiguous)."""
    shape, (a_strides, b_strides, _) = collapse(p.shape, p.a_strides, p.b_strides, p.out_strides)
    ba, bb, bo = gpu.bind("a_ptr", p.a), gpu.bind("b_ptr", p.b), gpu.bind("out_ptr", p.out)
    params = pack(
        *vec6(shape), *vec6(a_strides), *vec6(b_strides),
        p.size, ba.elem, bb.elem, bo.elem, BINARY_CODES[p.op], len(shape),
    )  # fmt: skip
    gpu.run([Step("broadcast_binary", params, (ba, bb, bo), grid_1d(p.size, 256))])


def cast(gpu: Gpu, p: v.CastProblem) -> None:
    """Convert between float16, bfloat16 and float32 (the same dtype: a bit copy)."""
    src, dst = p.dtype, p.out_dtype
    if dst.name not in _KINDS:
        raise UnsupportedError(
            f"cast to {dst.name} on the wgpu backend: WGSL has no float64 (use another backend)"
        )
    if src == dst:
        copy_range(gpu, p.input, p.output)
        return
    bs = gpu.bind("input_ptr", p.input, align=src.itemsize)
    bd = gpu.bind("output_ptr", p.output, align=dst.itemsize)
    words = ceil_div(bd.byte + p.output.nbytes, 4) - bd.byte // 4
    params = pack(words, p.n, bs.byte, bd.byte, _KINDS[src.name], _KINDS[dst.name])
    gpu.run([Step("convert", params, (bs, bd), grid_1d(words, 256))])

"""Reductions and softmax along an axis (wgpu_reduce.wgsl).

The tensor is viewed as [outer, length, inner]. Many short slices: one invocation per
slice; few long slices: one workgroup per slice with a tree in workgroup memory. Few
very long slices, or slices longer than one llvmpipe invocation may loop over, are cut
into chunks reduced by separate workgroups and combined in a further pass.
"""

from __future__ import annotations

from ... import validation as v
from ...errors import UnsupportedError
from ...types import ReduceOp
from .._common import REDUCE_CODES, ceil_div
from ._device import Gpu
from ._queue import MAX_GROUPS, Binding, Step, grid_1d, pack

__all__ = ["reduce", "softmax"]

#: Reductions of at most this many slices, each at least SPLIT_LENGTH long, run in two
#: passes: chunks of >= SPLIT_CHUNK elements (at most SPLIT_MAX_CHUNKS per slice), then
#: one workgroup per slice over the partial results.
SPLIT_SLICES = 256
SPLIT_LENGTH = 1 << 16
SPLIT_CHUNK = 4096
SPLIT_MAX_CHUNKS = 1024


def _axis_kernel(gpu: Gpu, p: v.AxisProblem, name: str, op_code: int) -> None:
    slices = p.outer * p.inner
    passes = 3 if name == "softmax" else 1  # softmax reads each slice three times
    group = p.length >= 256 and (p.inner == 1 or slices < 4096)
    loops = passes * (ceil_div(p.length, 256) + 11) if group else passes * (p.length + 1)
    split = (slices <= SPLIT_SLICES and p.length >= SPLIT_LENGTH) or (
        gpu.loop_budget is not None and loops > gpu.loop_budget
    )
    src = gpu.bind("input_ptr", p.input)
    dst = gpu.bind("output_ptr", p.output)
    if split:
        _split(gpu, p, name, op_code, src, dst)
        return
    params = pack(p.outer, p.length, p.inner, src.elem, dst.elem, op_code, slices, 0, p.length)
    if group:
        kernel = f"{name}_group"
        gx = min(slices, MAX_GROUPS)
        grid = (gx, ceil_div(slices, gx), 1)
        if grid[1] > MAX_GROUPS:
            raise UnsupportedError(f"{slices} slices exceed the device's dispatch grid limits")
    else:
        kernel = f"{name}_thread"
        grid = grid_1d(slices, 256)
    gpu.run([Step(kernel, params, (src, dst), grid)])


def _split(gpu: Gpu, p: v.AxisProblem, name: str, op_code: int, src: Binding, dst: Binding) -> None:
    """Reduce or softmax few very long slices in passes so that many workgroups share each slice.

    Every slice is cut into at most SPLIT_MAX_CHUNKS chunks of at least SPLIT_CHUNK
    elements; one workgroup per (chunk, slice) writes partial results to a scratch
    buffer that the next pass combines. No invocation loops more than
    chunk / 256 + chunks / 256 times.
    """
    slices = p.outer * p.inner
    chunk = max(SPLIT_CHUNK, ceil_div(p.length, SPLIT_MAX_CHUNKS))
    chunks = ceil_div(p.length, chunk)
    if slices > MAX_GROUPS:
        raise UnsupportedError(f"{slices} slices exceed the device's dispatch grid limits")
    gpu.check_loops(
        f"{name} over an axis of {p.length}", 2 * (ceil_div(chunk, 256) + ceil_div(chunks, 256)) + 30
    )
    grid = (chunks, slices, 1)
    if name == "reduce":
        partial_op = REDUCE_CODES[ReduceOp.SUM] if op_code == REDUCE_CODES[ReduceOp.MEAN] else op_code
        temp, bt = gpu.temporary(4 * slices * chunks, "computehal-partials")
        first = pack(p.outer, p.length, p.inner, src.elem, 0, partial_op, slices, chunk, p.length)
        second = pack(slices, chunks, 1, 0, dst.elem, op_code, slices, 0, p.length)
        steps = [
            Step("reduce_partial", first, (src, bt), grid),
            Step("reduce_group", second, (bt, dst), (slices, 1, 1)),
        ]
    else:
        temp, bt = gpu.temporary(12 * slices * chunks, "computehal-partials")
        params = pack(p.outer, p.length, p.inner, src.elem, dst.elem, op_code, slices, chunk, p.length)
        steps = [
            Step(f"softmax_split_{stage}", params, (src, dst, bt), grid)
            for stage in ("stats", "sums", "write")
        ]
    gpu.run(steps, retire=[temp])


def reduce(gpu: Gpu, p: v.AxisProblem) -> None:
    """Run a validated reduction."""
    assert p.op is not None
    _axis_kernel(gpu, p, "reduce", REDUCE_CODES[p.op])


def softmax(gpu: Gpu, p: v.AxisProblem) -> None:
    """Run a validated softmax (op code 1: log-softmax)."""
    _axis_kernel(gpu, p, "softmax", 1 if p.log else 0)
